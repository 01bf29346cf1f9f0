package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/elastic/go-elasticsearch/v8"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/indexer"
	"github.com/outboxd/outboxd/schema"
)

// dbFlags are the PostgreSQL flags every command shares.
type dbFlags struct {
	url    string
	schema string
	fs     *flag.FlagSet // for where, in errors
}

func addDBFlags(fs *flag.FlagSet) *dbFlags {
	f := &dbFlags{fs: fs}
	fs.StringVar(&f.url, "database-url", "", "PostgreSQL URL or DSN (default $DATABASE_URL)")
	fs.StringVar(&f.schema, "schema", schema.DefaultName, "outbox schema name")
	return f
}

func (f *dbFlags) pool(ctx context.Context) (*pgxpool.Pool, error) {
	cfg, err := f.poolConfig()
	if err != nil {
		return nil, err
	}
	return connectPool(ctx, cfg)
}

// poolConfig checks the flags and parses the URL, without connecting.
func (f *dbFlags) poolConfig() (*pgxpool.Config, error) {
	if f.url == "" {
		return nil, fmt.Errorf("database-url: not set (flag --database-url, env DATABASE_URL or database.url in --config)")
	}
	if err := schema.ValidateName(f.schema); err != nil {
		if w := where(f.fs, "schema"); w != "schema" {
			return nil, fmt.Errorf("%s: %w", w, err)
		}
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(f.url)
	if err != nil {
		// pgx's parse errors can echo the URL, password included.
		return nil, fmt.Errorf("%s: cannot be parsed as a PostgreSQL URL or DSN", where(f.fs, "database-url"))
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "outboxd"
	// JIT compilation costs tens of milliseconds per statement whose
	// estimated cost is high, and no statement of outboxd's runs long
	// enough to win it back: over an outbox of 300,000 retained events,
	// the stats query the admin server reads every 5 s (and every scrape)
	// was compiled for 18-150 ms to run for 0.06 ms, 2% of a core for an
	// idle relay's sessions, and a backfill's cursor read no faster with
	// it. A URL that sets jit itself keeps its setting.
	if _, set := cfg.ConnConfig.RuntimeParams["jit"]; !set {
		cfg.ConnConfig.RuntimeParams["jit"] = "off"
	}
	return cfg, nil
}

// connectPool opens a pool and checks that the server answers.
func connectPool(ctx context.Context, cfg *pgxpool.Config) (*pgxpool.Pool, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to PostgreSQL at %s:%d: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	return pool, nil
}

// esFlags are the Elasticsearch flags; credentials come only from the
// environment so they never show in ps output.
type esFlags struct {
	urls       string
	timeout    time.Duration
	awsSigV4   bool
	awsRegion  string
	awsService string
	fs         *flag.FlagSet // for the --config file's settings and where
}

func addESFlags(fs *flag.FlagSet) *esFlags {
	f := &esFlags{fs: fs}
	fs.StringVar(&f.urls, "elasticsearch-url", "", "Elasticsearch or OpenSearch node URLs, comma-separated (default $ELASTICSEARCH_URL or $OPENSEARCH_URL; credentials via ELASTICSEARCH_USERNAME/PASSWORD/API_KEY/CA_CERT/CERT_FINGERPRINT)")
	fs.DurationVar(&f.timeout, "elasticsearch-timeout", 30*time.Second, "Elasticsearch request timeout (or $ELASTICSEARCH_TIMEOUT)")
	fs.BoolVar(&f.awsSigV4, "aws-sigv4", false, "sign requests with AWS Signature Version 4 for Amazon OpenSearch Service, credentials from the AWS default chain (environment, shared config, web identity, container or instance role)")
	fs.StringVar(&f.awsRegion, "aws-region", "", "the OpenSearch Service domain's AWS region, for --aws-sigv4 (default $AWS_REGION, then the shared config's)")
	fs.StringVar(&f.awsService, "aws-service", "es", "for --aws-sigv4: es (an OpenSearch Service domain) or aoss (OpenSearch Serverless)")
	return f
}

// config builds the client's config here rather than in the indexer, so
// that the command line, the --config file, OUTBOXD_<FLAG> and the aliases
// (applied by parseFlags) decide, in that order, and no library reads the
// environment.
func (f *esFlags) config() (indexer.ClientConfig, error) {
	if f.timeout <= 0 {
		return indexer.ClientConfig{}, fmt.Errorf("%s: must be > 0, got %v", where(f.fs, "elasticsearch-timeout"), f.timeout)
	}
	// Credentials and TLS files come only from the --config file (search.*)
	// or the environment; the nodes and the timeout from the flags, which
	// parseFlags filled from them.
	file := fileSettingsOf(f.fs)
	c, err := indexer.ClientConfigFrom(func(key string) string {
		if key == "ELASTICSEARCH_URL" || key == "ELASTICSEARCH_TIMEOUT" {
			return ""
		}
		if file != nil {
			if v, ok := file.env[key]; ok {
				return v
			}
		}
		return os.Getenv(key)
	})
	c.Addresses, c.Timeout = indexer.SplitAddresses(f.urls), f.timeout
	if err != nil || !f.awsSigV4 {
		return c, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := []func(*awsconfig.LoadOptions) error{}
	if f.awsRegion != "" {
		opts = append(opts, awsconfig.WithRegion(f.awsRegion))
	}
	aws, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return c, fmt.Errorf("aws-sigv4: loading the AWS configuration: %w", err)
	}
	if aws.Region == "" {
		return c, fmt.Errorf("aws-region: not set (flag --aws-region, search.aws.region in --config, env AWS_REGION or the shared config's region): SigV4 signs for one region")
	}
	c.AWS = &indexer.AWSSigning{Region: aws.Region, Service: f.awsService, Credentials: aws.Credentials}
	return c, nil
}

func (f *esFlags) client() (*elasticsearch.Client, error) {
	c, err := f.config()
	if err != nil {
		return nil, err
	}
	return indexer.NewClient(c)
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// envAliases are the documented variables besides OUTBOXD_<FLAG>, by flag
// name, or by "command flag" where only one command's flag has one.
var envAliases = map[string]string{
	"database-url":          "DATABASE_URL",
	"elasticsearch-url":     "ELASTICSEARCH_URL OPENSEARCH_URL",
	"elasticsearch-timeout": "ELASTICSEARCH_TIMEOUT",
	"status max-age":        "OUTBOXD_STATUS_MAX_AGE",
}

// envKeys are the variables that may set a flag, most specific first.
func envKeys(fs *flag.FlagSet, name string) []string {
	keys := []string{"OUTBOXD_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))}
	for _, k := range []string{fs.Name() + " " + name, name} {
		if a, ok := envAliases[k]; ok {
			keys = append(keys, strings.Fields(a)...)
		}
	}
	return keys
}

// parseFlags is the one configuration path of every command: it parses
// args, then, for a command that connects, applies the --config file (or
// $OUTBOXD_CONFIG) to every flag the command line did not set, then fills
// every flag still unset from the first of OUTBOXD_<NAME> (dashes become
// underscores) and the flag's documented alias that is set: the command
// line wins, then the file, then the environment. The file comes before
// the environment because naming it is deliberate, while DATABASE_URL and
// the like may be set for other tools. No default comes from a variable
// that may hold a credential, so --help cannot print one; the credentials
// the flags end up with are remembered for redaction.
func parseFlags(fs *flag.FlagSet, args []string) error {
	secrets.addEnv()
	fs.SetOutput(redactWriter{w: fs.Output(), r: secrets})
	withConfig := takesConfig(fs)
	if withConfig && fs.Lookup("config") == nil {
		fs.String("config", "", "YAML `file` of settings, as docs/deploy/outboxd.yaml shows: ${VAR} takes a value from the environment; the command line wins over it (or $OUTBOXD_CONFIG)")
	}
	usage := fs.Usage
	fs.Usage = func() {
		usage()
		if withConfig {
			fmt.Fprintln(fs.Output(), "\nEvery flag can also be set in the environment as OUTBOXD_<FLAG> (dashes as underscores,\ne.g. OUTBOXD_SCHEMA), a few also by the $VARIABLE their help names, and in the --config file.\nThe command line wins, then the --config file, then OUTBOXD_<FLAG>, then $VARIABLE.")
			return
		}
		fmt.Fprintln(fs.Output(), "\nEvery flag can also be set in the environment as OUTBOXD_<FLAG> (dashes as underscores,\ne.g. OUTBOXD_SCHEMA), a few also by the $VARIABLE their help names. The command line wins,\nthen OUTBOXD_<FLAG>, then $VARIABLE.")
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if withConfig {
		path := fs.Lookup("config").Value.String()
		if v, ok := os.LookupEnv("OUTBOXD_CONFIG"); ok && !set["config"] {
			path = v
			_ = fs.Set("config", v)
		}
		set["config"] = true
		if path != "" {
			if err := applyConfigFile(fs, path, set); err != nil {
				return err
			}
		}
	}
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if !set[f.Name] && err == nil {
			for _, key := range envKeys(fs, f.Name) {
				if v, ok := os.LookupEnv(key); ok {
					if e := fs.Set(f.Name, v); e != nil {
						err = fmt.Errorf("%s: %w", key, e)
					}
					break
				}
			}
		}
		switch v := f.Value.String(); {
		case secretFlags[f.Name]:
			secrets.add(v)
		case urlFlags[f.Name]:
			secrets.addURL(v)
		}
		if d, ok := f.Value.(*destinationFlags); ok {
			for _, spec := range *d {
				secrets.addDestination(spec)
			}
		}
	})
	return err
}
