package indexer

import (
	"net/url"
	"os"
	"strings"
	"testing"
)

// README, "Configuration": secrets are never logged. The relay logs
// ClientConfig.String(); it must carry neither the password nor the API key,
// wherever they come from (the fields or a URL's userinfo).
func TestGuaranteeClientConfigStringRedactsSecrets(t *testing.T) {
	// Not parallel: a subtest sets the environment.
	for _, c := range []struct {
		cfg   ClientConfig
		nodes []string // what must still name the nodes
	}{
		{ClientConfig{Addresses: []string{"https://elastic:pw-url-secret@es1:9200", "http://es2:9200"}}, []string{"@es1:9200", "http://es2:9200"}},
		{ClientConfig{Addresses: []string{"http://es:9200"}, Username: "elastic", Password: "pw-field-secret"}, []string{"http://es:9200", "elastic"}},
		{ClientConfig{Addresses: []string{"http://es:9200"}, APIKey: "apikey-secret"}, []string{"http://es:9200"}},
		{ClientConfig{Addresses: []string{"http://u:pw-url-secret@es:9200/"}, Username: "u", Password: "pw-field-secret", APIKey: "apikey-secret"}, []string{"@es:9200"}},
	} {
		s := c.cfg.String()
		secrets := configSecrets(t, c.cfg)
		if len(secrets) == 0 {
			t.Fatalf("test case %+v holds no secret", c.cfg)
		}
		for _, secret := range secrets {
			if strings.Contains(s, secret) {
				t.Errorf("ClientConfig.String() = %q leaks %q", s, secret)
			}
		}
		for _, node := range c.nodes {
			if !strings.Contains(s, node) {
				t.Errorf("ClientConfig.String() = %q no longer shows %q", s, node)
			}
		}
	}
	// Setting the same config from the environment must not change that.
	t.Run("from the environment", func(t *testing.T) {
		t.Setenv("ELASTICSEARCH_URL", "http://elastic:pw-env-url@127.0.0.1:9200")
		t.Setenv("ELASTICSEARCH_USERNAME", "elastic")
		t.Setenv("ELASTICSEARCH_PASSWORD", "pw-env-field")
		c, err := ClientConfigFrom(os.Getenv)
		if err != nil {
			t.Fatal(err)
		}
		secrets := configSecrets(t, c)
		if len(secrets) != 2 {
			t.Fatalf("the config from the environment holds %d secrets, want the URL's and the password", len(secrets))
		}
		s := c.String()
		for _, secret := range secrets {
			if strings.Contains(s, secret) {
				t.Errorf("ClientConfig.String() = %q leaks %q", s, secret)
			}
		}
		if !strings.Contains(s, "127.0.0.1:9200") {
			t.Errorf("ClientConfig.String() = %q no longer shows the node", s)
		}
	})
}

// configSecrets are the values c must never show: its password, API key
// and the passwords in its addresses' userinfo.
func configSecrets(t *testing.T, c ClientConfig) []string {
	t.Helper()
	var out []string
	for _, v := range []string{c.Password, c.APIKey} {
		if v != "" {
			out = append(out, v)
		}
	}
	for _, a := range c.Addresses {
		u, err := url.Parse(a)
		if err != nil {
			t.Fatal(err)
		}
		if p, ok := u.User.Password(); ok {
			out = append(out, p)
		}
	}
	return out
}
