package main

import (
	"context"
	"flag"
	"io"
	"os"
	"strings"
	"testing"
)

// README, "Amazon OpenSearch Service": --aws-sigv4 takes the region from
// the flag or AWS_REGION and the credentials from the AWS default chain
// (here its environment step); OPENSEARCH_URL stands for ELASTICSEARCH_URL.
// No AWS endpoint is reached: the signing itself is verified in the
// indexer's tests against a loopback proxy.
func TestAWSSigV4Flags(t *testing.T) {
	t.Setenv("AWS_CONFIG_FILE", "/nonexistent")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDFROMENV")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret-from-env")
	t.Setenv("ELASTICSEARCH_URL", "") // restored at the end
	os.Unsetenv("ELASTICSEARCH_URL")
	t.Setenv("OPENSEARCH_URL", "https://search-d.eu-west-1.es.amazonaws.com")
	parse := func(args ...string) *esFlags {
		t.Helper()
		fs := flag.NewFlagSet("relay", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		f := addESFlags(fs)
		if err := parseFlags(fs, args); err != nil {
			t.Fatal(err)
		}
		return f
	}

	t.Setenv("AWS_REGION", "")
	if _, err := parse("--aws-sigv4").config(); err == nil || !strings.Contains(err.Error(), "aws-region: not set") {
		t.Fatalf("no region: %v", err)
	}
	t.Setenv("AWS_REGION", "eu-west-1")
	c, err := parse("--aws-sigv4", "--aws-service", "aoss").config()
	if err != nil {
		t.Fatal(err)
	}
	if c.AWS == nil || c.AWS.Region != "eu-west-1" || c.AWS.Service != "aoss" || len(c.Addresses) != 1 || c.Addresses[0] != "https://search-d.eu-west-1.es.amazonaws.com" {
		t.Fatalf("config: %+v %v", c, c.AWS)
	}
	creds, err := c.AWS.Credentials.Retrieve(context.Background())
	if err != nil || creds.AccessKeyID != "AKIDFROMENV" {
		t.Fatalf("credentials: %v %v", creds.AccessKeyID, err)
	}
	if c, err = parse("--aws-sigv4", "--aws-region", "us-east-2").config(); err != nil || c.AWS.Region != "us-east-2" || c.AWS.Service != "es" {
		t.Fatalf("--aws-region: %+v %v", c.AWS, err)
	}
	if strings.Contains(c.String(), "secret") {
		t.Fatalf("String shows a secret: %s", c)
	}
	if c, err = parse().config(); err != nil || c.AWS != nil {
		t.Fatalf("without --aws-sigv4: %+v %v", c.AWS, err)
	}
}
