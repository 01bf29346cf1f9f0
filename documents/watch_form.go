package documents

import "errors"

// The trigger runs a row key over a whole statement's rows by rewriting
// $1 to the row alias (watch_key_rows in migration 0040). That rewrite
// knows '...' strings and "..." identifiers only, so a key with another
// kind of literal or a comment outside them is refused by its form: the
// simplest safe rule, since a \' in an E-string or a quote in a comment
// pairs the wrong quotes and leaves a $1 unrewritten (or rewrites one
// inside a string). Query keys are not rewritten (the relay runs them
// with $1 bound), so the rule is for row keys only.

// skipKeyFormRule lets a test reach the run of the trigger's statement at
// watch time (export_test.go).
var skipKeyFormRule bool

// keyForm refuses a row key that the $1 rewrite cannot handle. It reads
// the key as the rewrite does: '...' and "..." are skipped whole, and the
// first E-string, dollar quote or comment outside them is refused (the
// scan stops there, so it never has to read one).
func keyForm(key string) error {
	ident := func(c byte) bool {
		return c == '_' || c == '$' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		next := byte(0)
		if i+1 < len(key) {
			next = key[i+1]
		}
		switch {
		case c == '\'' || c == '"':
			// To the closing quote; a doubled quote stays inside.
			for i++; i < len(key); i++ {
				if key[i] == c {
					if i+1 < len(key) && key[i+1] == c {
						i++
						continue
					}
					break
				}
			}
		case (c == 'E' || c == 'e') && next == '\'' && (i == 0 || !ident(key[i-1])):
			return errors.New("key: has an E'...' string, which the trigger's $1 rewrite cannot read: use a '...' string (chr(39) for a quote)")
		case c == '$' && (next == '$' || next == '_' || next >= 'a' && next <= 'z' || next >= 'A' && next <= 'Z'):
			return errors.New("key: has a $$ (dollar-quoted) string, which the trigger's $1 rewrite cannot read: use a '...' string")
		case c == '-' && next == '-' || c == '/' && next == '*':
			return errors.New("key: has a comment (-- or /*), which the trigger's $1 rewrite cannot read: remove it")
		}
	}
	return nil
}
