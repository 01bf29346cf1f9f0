package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"
)

// relayCommands take every key of the --config file; the others only the
// connection settings (database, search).
var relayCommands = map[string]bool{"relay": true, "check": true}

// takesConfig reports whether a command has a --config flag: the ones
// that connect to PostgreSQL or the search server.
func takesConfig(fs *flag.FlagSet) bool {
	return fs.Lookup("database-url") != nil || fs.Lookup("elasticsearch-url") != nil
}

// fileSettings is what a --config file gave one command's flag set.
type fileSettings struct {
	path string
	// env holds the search server's environment-only settings the file
	// gives (ELASTICSEARCH_PASSWORD, ...); esFlags.config reads them first.
	env map[string]string
	// origin says, by flag name, where in the file the value came from
	// ("outboxd.yaml:12: pages.linger"), for errors about it.
	origin map[string]string
}

// fromFile holds the fileSettings of each flag set parseFlags filled from
// a file (a handful per process; tests make more).
var fromFile sync.Map // *flag.FlagSet -> *fileSettings

func fileSettingsOf(fs *flag.FlagSet) *fileSettings {
	if fs == nil {
		return nil
	}
	v, _ := fromFile.Load(fs)
	s, _ := v.(*fileSettings)
	return s
}

// where names a flag in an error: by its key and line when the file set
// it, else by its name.
func where(fs *flag.FlagSet, name string) string {
	if s := fileSettingsOf(fs); s != nil {
		if o, ok := s.origin[name]; ok {
			return o
		}
	}
	return name
}

// locate rewrites an error that starts with a flag's name ("linger: must
// be >= 0") to name the file's key and line instead, when the file set it.
func locate(fs *flag.FlagSet, err error) error {
	if err == nil {
		return nil
	}
	name, rest, ok := strings.Cut(err.Error(), ": ")
	if !ok {
		return err
	}
	if o := where(fs, name); o != name {
		return &locatedError{msg: o + ": " + rest, err: err}
	}
	return err
}

type locatedError struct {
	msg string
	err error
}

func (e *locatedError) Error() string { return e.msg }
func (e *locatedError) Unwrap() error { return e.err }

// applyConfigFile sets each flag of fs that the file at path sets, that
// the command takes from a file, and that the command line did not set
// (set, which it extends, so the environment does not override the file
// either). Every problem is reported, each as path:line: key: reason.
func applyConfigFile(fs *flag.FlagSet, path string, set map[string]bool) error {
	c, err := loadConfigFile(path)
	if err != nil {
		return err
	}
	st := fileSettingsOf(fs)
	if st == nil {
		st = &fileSettings{env: map[string]string{}, origin: map[string]string{}}
		fromFile.Store(fs, st)
	}
	st.path = path
	dir := filepath.Dir(path)
	relay := relayCommands[fs.Name()]
	var errs []error
	for _, k := range fileKeys(c) {
		switch {
		case !k.conn && !relay:
			continue
		case k.flag != "" && (fs.Lookup(k.flag) == nil || set[k.flag]):
			continue // not this command's, or the command line wins
		case k.env != "" && fs.Lookup("elasticsearch-url") == nil:
			continue
		}
		v, err := k.value(dir, os.LookupEnv)
		if err != nil {
			errs = append(errs, k.errorf(path, "%v", err))
			continue
		}
		origin := fmt.Sprintf("%s:%d: %s", path, k.node.Line, k.path)
		if k.env != "" {
			st.env[k.env] = v
			if k.kind == "secret" {
				secrets.add(v)
			}
			continue
		}
		f := fs.Lookup(k.flag)
		if err := fs.Set(k.flag, v); err != nil {
			errs = append(errs, k.errorf(path, "%s", setReason(f)))
			continue
		}
		set[k.flag], st.origin[k.flag] = true, origin
		warnShadowed(k.flag, v, origin)
	}
	if relay && fs.Lookup("destination") != nil && !set["destination"] && len(c.Destinations) > 0 {
		for i, d := range c.Destinations {
			spec, err := destinationSpec(d, i, path, dir)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			_ = fs.Set("destination", spec) // destinationFlags.Set never fails
		}
		set["destination"] = true
		st.origin["destination"] = fmt.Sprintf("%s: destinations", path)
	}
	return errors.Join(errs...)
}

// warnShadowed says when an OUTBOXD_<FLAG> variable is set but the file's
// value wins: both look deliberate, and only one applies.
func warnShadowed(name, fileValue, origin string) {
	key := "OUTBOXD_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
	if v, ok := os.LookupEnv(key); ok && v != fileValue {
		slog.Warn("config: the file's value wins over the environment's", "variable", key, "key", origin)
	}
}

// setReason says why fs.Set refused a value, without quoting it.
func setReason(f *flag.Flag) string {
	if g, ok := f.Value.(flag.Getter); ok {
		switch g.Get().(type) {
		case time.Duration:
			return "not a duration (such as 500ms, 30s, 5m or 1h30m)"
		case int:
			return "not a whole number"
		case bool:
			return "not true or false"
		}
	}
	return "not a value this setting takes"
}

func (k fileKey) errorf(path, format string, args ...any) error {
	return fmt.Errorf("%s:%d: %s: %s", path, k.node.Line, k.path, fmt.Sprintf(format, args...))
}

// value reads the setting: one value, or for a list kind a list of them
// (joined with commas, as the flag takes them), with ${VAR} expanded;
// sizes may carry a unit (4MiB), and a relative path is taken from the
// file's directory dir. The values of the variables it expands are
// redacted from every output, except that a variable making up a whole
// URL is redacted as URLs are (password, a webhook's path and query).
func (k fileKey) value(dir string, lookup func(string) (string, bool)) (string, error) {
	n := k.node
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	items := []*yaml.Node{n}
	switch n.Kind {
	case yaml.ScalarNode:
	case yaml.SequenceNode:
		if k.kind != "list" && k.kind != "urls" {
			return "", errors.New("a list where a single value belongs")
		}
		items = n.Content
	default:
		return "", errors.New("a mapping where a value belongs")
	}
	vals := make([]string, 0, len(items))
	for _, it := range items {
		if it.Kind == yaml.AliasNode {
			it = it.Alias
		}
		if it.Kind != yaml.ScalarNode {
			return "", errors.New("a list item that is not a single value")
		}
		if it.Tag == "!!null" {
			return "", errors.New(`no value (write "" for an empty one)`)
		}
		v, used, whole, err := expandVars(it.Value, lookup)
		if err != nil {
			return "", err
		}
		for _, u := range used {
			if !whole || (k.kind != "url" && k.kind != "urls") {
				secrets.add(u)
			}
		}
		vals = append(vals, v)
	}
	v := strings.Join(vals, ",")
	switch k.kind {
	case "size":
		n, _, err := parseBytes(v)
		if err != nil || n > int64(^uint(0)>>1) {
			return "", errors.New("not a size in bytes (such as 4194304 or 4MiB)")
		}
		v = strconv.FormatInt(n, 10)
	case "path":
		if v != "" && !filepath.IsAbs(v) {
			v = filepath.Join(dir, v)
		}
	}
	return v, nil
}

// expandVars replaces each ${NAME} in s by the variable's value and each
// $$ by one $; any other $ stays as it is (a check's $1 and $2). It
// returns the values it put in, and whether s was one ${NAME} alone. An
// unset variable is an error naming it (an empty one is a value).
func expandVars(s string, lookup func(string) (string, bool)) (out string, used []string, whole bool, err error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '{':
			end := strings.IndexByte(s[i+2:], '}')
			if end < 0 {
				return "", nil, false, errors.New("a ${ without its closing } (write $$ for a literal $)")
			}
			name := s[i+2 : i+2+end]
			if !isVarName(name) {
				return "", nil, false, errors.New("a ${...} that is not a variable name of letters, digits and _ (write $$ for a literal $)")
			}
			v, ok := lookup(name)
			if !ok {
				return "", nil, false, fmt.Errorf("environment variable %s is not set", name)
			}
			whole = i == 0 && i+3+end == len(s)
			b.WriteString(v)
			used = append(used, v)
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String(), used, whole && len(used) == 1, nil
}

func isVarName(s string) bool {
	if s == "" || (s[0] >= '0' && s[0] <= '9') {
		return false
	}
	for _, c := range s {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// destinationSpec writes one destination of the file as the --destination
// flag's value, NAME=URL,option=value,...,check=SQL: the relay and check
// read it as they read the flag's.
func destinationSpec(d fileDestination, i int, path, dir string) (string, error) {
	var name, url string
	var opts []string
	var errs []error
	keys := destinationKeys(d, i)
	for _, k := range keys {
		v, err := k.value(dir, os.LookupEnv)
		if err != nil {
			errs = append(errs, k.errorf(path, "%v", err))
			continue
		}
		opt := k.path[strings.LastIndexByte(k.path, '.')+1:]
		if opt != "check" && strings.Contains(v, ",") {
			reason := "holds a comma, which separates the options of --destination"
			if opt == "url" {
				reason += " (escape it in the URL as %2C)"
			}
			errs = append(errs, k.errorf(path, "%s", reason))
			continue
		}
		switch opt {
		case "name":
			name = v
		case "url":
			url = v
		default:
			opts = append(opts, opt+"="+v)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return "", err
	}
	if name == "" || url == "" {
		at := path
		if len(keys) > 0 {
			at += ":" + strconv.Itoa(keys[0].node.Line)
		}
		return "", fmt.Errorf("%s: destinations[%d]: needs a name and a url", at, i)
	}
	return strings.Join(append([]string{name + "=" + url}, opts...), ","), nil
}
