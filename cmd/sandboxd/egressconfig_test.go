package main

import (
	"strings"
	"testing"
	"time"

	"github.com/sbxlog/sbxlog/fsm"
)

// The old config's egress keys load (secrets, egress_classes,
// egress_internal_allow, a pool's egress) and are checked with its texts.
func TestConfigEgress(t *testing.T) {
	write := configWriter(t)
	good := `{"secrets":[{"name":"gh","header":"Authorization","value_env":"GH_TOKEN"},{"name":"GW_KEY","header":"X-Api-Key"}],
		"pools":[{"template":"rt","net":"none","size":"small","warm":1,"egress":{"socks5":true,"allow":[{"host":"api.github.com","methods":["GET","POST"],"ports":[443],"secret":"gh"},{"host":"*"}]}}],
		"egress_classes":[{"name":"desk","egress":{"allow":[{"host":"api.github.com"}]}}],
		"egress_internal_allow":["10.8.0.1/32:18090,9000","fdc8::/16"],"egress_usage_seconds":30}`
	cfg, err := loadConfig(write(good))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.finish(); err != nil {
		t.Fatal(err)
	}
	ec := cfg.egressConfig()
	k := fsm.PoolKey{Template: "rt", Net: "none", Size: "small"}
	if len(ec.Secrets) != 2 || ec.Secrets[0].ValueEnv != "GH_TOKEN" || len(ec.Classes) != 1 || ec.Classes[0].Name != "desk" ||
		ec.PoolEgress[k] == nil || !ec.PoolEgress[k].Socks5 || len(ec.InternalAllow) != 2 || ec.UsageEvery != 30*time.Second {
		t.Fatalf("egress config %+v", ec)
	}
	for _, tc := range []struct{ body, want string }{
		{`{"secrets":[{"name":"gh","header":"Authorization","value":"s3cr3t"}]}`, "secrets[0]: value is not supported, use value_env"},
		{`{"secrets":[{"name":"gw-key","header":"X"}]}`, "has no value_env"},
		{`{"pools":[{"template":"rt","warm":1,"egress":{"allow":[{"host":"*","secret":"nope"}]}}]}`, `pool "rt" egress: allow[0]: unknown secret "nope"`},
		{`{"pools":[{"template":"rt","warm":1,"egress":{"allow":[{"host":""}]}}]}`, `pool "rt" egress: allow[0]: host must not be empty`},
		{`{"pools":[{"template":"rt","warm":1,"egress":{"allow":[{"host":"*","intercept":true}]}}]}`, "intercept needs egress_ca"},
		{`{"egress_classes":[{"name":"d","egress":{"allow":[{"host":"*","intercept":"inject"}]}}]}`, `egress class "d" egress: allow[0]: intercept may only be set on a pool rule`},
		{`{"egress_classes":[{"name":"d"}]}`, `egress class "d" needs egress`},
		{`{"egress_classes":[{"name":"d","egress":{"allow":[]}},{"name":"d","egress":{"allow":[]}}]}`, `duplicate egress class "d"`},
		{`{"egress_internal_allow":["10.0.0.1"]}`, "egress_internal_allow[0]"},
		{`{"egress_usage_seconds":-1}`, "egress_usage_seconds"},
	} {
		cfg, err := loadConfig(write(tc.body))
		if err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		if err := cfg.finish(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: finish = %v, want %q", tc.body, err, tc.want)
		}
	}
	// With the node CA (egress_proxy.intercept) a pool may intercept.
	cfg, err = loadConfig(write(`{"egress_proxy":{"intercept":true},"pools":[{"template":"rt","warm":1,"egress":{"allow":[{"host":"*","intercept":true}]}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.finish(); err != nil {
		t.Fatalf("an intercept rule with egress_proxy.intercept: %v", err)
	}
	// The secret's value is never in the file: a "value" is refused, and
	// the error does not echo it.
	cfg, _ = loadConfig(write(`{"secrets":[{"name":"gh","header":"Authorization","value":"s3cr3t"}]}`))
	if err := cfg.finish(); err == nil || strings.Contains(err.Error(), "s3cr3t") {
		t.Errorf("finish = %v", err)
	}
}
