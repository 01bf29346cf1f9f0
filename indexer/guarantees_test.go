package indexer

import (
	"strings"
	"testing"
)

// README, "Configuration": secrets are never logged. The relay logs
// ClientConfig.String(); it must carry neither the password nor the API key,
// wherever they come from (the fields or a URL's userinfo).
func TestGuaranteeClientConfigStringRedactsSecrets(t *testing.T) {
	// Not parallel: a subtest sets the environment.
	for _, c := range []ClientConfig{
		{Addresses: []string{"https://elastic:pw-url-secret@es1:9200", "http://es2:9200"}},
		{Addresses: []string{"http://es:9200"}, Username: "elastic", Password: "pw-field-secret"},
		{Addresses: []string{"http://es:9200"}, APIKey: "apikey-secret"},
		{Addresses: []string{"http://u:pw-url-secret@es:9200/"}, Username: "u", Password: "pw-field-secret", APIKey: "apikey-secret"},
	} {
		s := c.String()
		for _, secret := range []string{"pw-url-secret", "pw-field-secret", "apikey-secret"} {
			if strings.Contains(s, secret) {
				t.Errorf("ClientConfig.String() = %q leaks %q", s, secret)
			}
		}
		if !strings.Contains(s, "es") {
			t.Errorf("ClientConfig.String() = %q no longer names the nodes", s)
		}
	}
	// Setting the same config from the environment must not change that.
	t.Run("from the environment", func(t *testing.T) {
		t.Setenv("ELASTICSEARCH_URL", "http://elastic:pw-env-url@127.0.0.1:9200")
		t.Setenv("ELASTICSEARCH_USERNAME", "elastic")
		t.Setenv("ELASTICSEARCH_PASSWORD", "pw-env-field")
		c, err := ClientConfigFromEnv()
		if err != nil {
			t.Fatal(err)
		}
		if s := c.String(); strings.Contains(s, "pw-env-url") || strings.Contains(s, "pw-env-field") || !strings.Contains(s, "127.0.0.1:9200") {
			t.Fatalf("ClientConfig.String() = %q", s)
		}
	})
}
