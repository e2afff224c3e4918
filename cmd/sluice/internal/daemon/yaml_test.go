package daemon

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// yamlBomb is a few kilobytes whose aliases expand to a billion nodes:
// nine levels, each a list of ten aliases of the level below.
func yamlBomb() string {
	var b strings.Builder
	b.WriteString("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i < 9; i++ {
		fmt.Fprintf(&b, "a%d: &a%d [%s]\n", i, i, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*a%d, ", i-1), 10), ", "))
	}
	return b.String()
}

// The three YAML files the daemon reads (its configuration, rules_file and
// the files of envoy_config_dir) go through the one strict reader: the
// same alias bomb, key given twice and nesting bomb are refused by each,
// naming file:line:col and the field, before the file's own schema is
// looked at.
func TestYAMLFilesUseTheStrictReader(t *testing.T) {
	readers := []struct {
		name string
		load func(t *testing.T, text string) (path string, err error)
	}{
		{"config file", func(t *testing.T, text string) (string, error) {
			path := writeFile(t, text)
			_, err := Load([]string{"--config", path}, envMap(nil), io.Discard)
			return path, err
		}},
		{"rules_file", func(t *testing.T, text string) (string, error) {
			cfg := testConfig("yaml-rules")
			cfg.RulesFile = filepath.Join(t.TempDir(), "rules.yaml")
			if err := os.WriteFile(cfg.RulesFile, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			d, err := New(cfg, WithLogOutput(io.Discard))
			if err == nil {
				d.Close()
			}
			return cfg.RulesFile, err
		}},
		{"envoy_config_dir", func(t *testing.T, text string) (string, error) {
			cfg := testConfig("yaml-envoy")
			cfg.EnvoyConfigDir = t.TempDir()
			writeEnvoyFile(t, cfg.EnvoyConfigDir, "api.yaml", text)
			d, err := New(cfg, WithLogOutput(io.Discard))
			if err == nil {
				d.Close()
			}
			return filepath.Join(cfg.EnvoyConfigDir, "api.yaml"), err
		}},
	}
	docs := []struct {
		name, text string
		want       string // after the file's path
	}{
		{"an alias bomb", yamlBomb(), ":6:45: a5[7]: the alias *a4 expands the document beyond 1000000 nodes"},
		{"a key twice", "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, unit: hour}\n",
			`:4:29: descriptors[0].rate_limit.unit: the key "unit" is given twice (first at line 4, column 18)`},
		{"a nesting bomb", "join: " + strings.Repeat("[", 150) + strings.Repeat("]", 150) + "\n", ":1:106: join" + strings.Repeat("[0]", 99) + ": the document nests deeper than 100 levels"},
	}
	for _, r := range readers {
		for _, doc := range docs {
			t.Run(r.name+", "+doc.name, func(t *testing.T) {
				path, err := r.load(t, doc.text)
				if err == nil || !strings.Contains(err.Error(), path+doc.want) {
					t.Fatalf("%v, want an error holding %q", err, path+doc.want)
				}
			})
		}
	}
}

// The configuration file is bounded as the others are: 1 MiB loads, one
// byte more is refused naming the file and the limit, unread beyond it.
func TestConfigFileSizeBound(t *testing.T) {
	const max = 1 << 20
	at := "node_name: a\n" + strings.Repeat("#", max-13)
	if c, err := Load([]string{"--config", writeFile(t, at)}, envMap(nil), io.Discard); err != nil || c.NodeName != "a" {
		t.Fatalf("a file of %d bytes: %v", len(at), err)
	}
	path := writeFile(t, at+"#")
	if _, err := Load([]string{"--config", path}, envMap(nil), io.Discard); err == nil ||
		!strings.Contains(err.Error(), path+": the file is larger than the limit of 1048576 bytes") {
		t.Fatalf("a file of %d bytes: %v", len(at)+1, err)
	}
}
