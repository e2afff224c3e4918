package envoyrls

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice/internal/yamlfile"
)

// MaxFileBytes bounds one configuration file; MaxDirFiles the files of a
// directory LoadDir reads.
const (
	MaxFileBytes = 1 << 20
	MaxDirFiles  = 1000
)

// readerConfig bounds a configuration file: MaxFileBytes, and the
// nesting and the nodes, aliases expanded, of every file sluice reads.
var readerConfig = func() yamlfile.Config {
	c := yamlfile.DefaultConfig()
	c.MaxBytes = MaxFileBytes
	return c
}()

// ParseDomain reads one configuration file in envoyproxy/ratelimit's
// format: a domain and its descriptors, each with a key, an optional
// value, an optional rate_limit (unit, requests_per_unit, unlimited,
// name, replaces), shadow_mode, quota_mode, detailed_metric,
// value_to_metric, share_threshold, metadata (read and ignored) and
// nested descriptors. Booleans may be written as YAML 1.1 has them (yes,
// no, on, off), as envoyproxy/ratelimit reads them. An unknown or
// misplaced field, a value of the wrong type, an invalid unit and the
// rest are [*ConfigError] values naming file, line and column. Data
// longer than MaxFileBytes, a key given twice in a mapping, a nesting
// deeper than 100 levels and aliases that expand the document beyond a
// million nodes are refused before any field is read.
func ParseDomain(file string, data []byte) (*Domain, error) {
	return ParseDomainWith(file, data, LoadConfig{Strict: true})
}

// LoadConfig says how configuration files are read. The zero value, which
// DefaultLoadConfig returns, is lenient and refuses a domain configured
// twice.
type LoadConfig struct {
	// Strict refuses a key that the format knows but not where it stands
	// (unit on a descriptor, say). Lenient, the default, ignores such a
	// key with a warning, as envoyproxy/ratelimit ignores it silently, so
	// that every file it runs runs here. A key the format does not know
	// at all is an error either way, as with envoyproxy/ratelimit.
	Strict bool
	// MergeDomains makes the files of one domain one configuration
	// (MergeRules), as envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG;
	// otherwise a domain configured twice is an error wrapping
	// ErrDuplicateDomain.
	MergeDomains bool
	// Warn, when set, receives each key a lenient read ignored, at its
	// file, line and column. It must not block for long.
	Warn func(*ConfigError)
}

// DefaultLoadConfig is lenient and does not merge domains.
func DefaultLoadConfig() LoadConfig { return LoadConfig{} }

// knownKeys are the keys of envoyproxy/ratelimit's format, wherever they
// stand: a lenient read ignores one out of place.
var knownKeys = map[string]bool{
	"domain": true, "key": true, "value": true, "descriptors": true, "rate_limit": true, "unit": true,
	"requests_per_unit": true, "unlimited": true, "shadow_mode": true, "quota_mode": true, "name": true,
	"replaces": true, "detailed_metric": true, "value_to_metric": true, "share_threshold": true, "metadata": true,
}

// ParseDomainWith reads one configuration file as ParseDomain does, under
// lc (Strict, and Warn; MergeDomains is for directories).
func ParseDomainWith(file string, data []byte, lc LoadConfig) (*Domain, error) {
	p := &parser{file: file, lc: lc}
	root, err := yamlfile.Parse(file, data, readerConfig)
	if err != nil {
		return nil, readerError(file, err)
	}
	if root == nil {
		return nil, p.errorf(nil, "the file is empty: it must name a domain")
	}
	var name string
	var descriptors []*Descriptor
	err = p.mapping(root, []string{"domain", "descriptors"}, func(key string, v *yaml.Node) error {
		var err error
		switch key {
		case "domain":
			name, err = p.str(v)
		default:
			descriptors, err = p.descriptors(v)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if name == "" {
		return nil, p.errorf(root, "the domain is empty")
	}
	return NewDomain(file, name, descriptors)
}

// readerError turns an error of the YAML reader into a *ConfigError at
// its position.
func readerError(file string, err error) error {
	var ye *yamlfile.Error
	if !errors.As(err, &ye) {
		return fmt.Errorf("envoyrls: %w", err)
	}
	msg := ye.Message
	switch {
	case errors.Is(err, yamlfile.ErrSyntax):
		msg = "not valid YAML: " + msg
	case ye.Field != "":
		msg = ye.Field + ": " + msg
	}
	return &ConfigError{File: file, Line: ye.Line, Column: ye.Column, Err: ErrInvalidConfig, Message: msg}
}

// parser walks the nodes of one file, which the YAML reader has bounded:
// following every alias visits at most a million nodes.
type parser struct {
	file string
	lc   LoadConfig
}

// errorf returns a *ConfigError at n's line and column (none for a nil
// n).
func (p *parser) errorf(n *yaml.Node, format string, a ...any) error {
	e := &ConfigError{File: p.file, Err: ErrInvalidConfig, Message: fmt.Sprintf(format, a...)}
	if n != nil {
		e.Line, e.Column = n.Line, n.Column
	}
	return e
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.Tag == "!!null" }

// collection returns n resolved when it is of kind; nil for null, or with
// an error that wants what want says.
func (p *parser) collection(n *yaml.Node, kind yaml.Kind, want string) (*yaml.Node, error) {
	n = yamlfile.Deref(n)
	switch {
	case isNull(n):
		return nil, nil
	case n.Kind != kind:
		return nil, p.errorf(n, "want %s, not %s", want, describe(n))
	}
	return n, nil
}

// mapping calls f with each key of the mapping n and its value, in order;
// a key outside allowed, or a key that is not text is an error (the
// reader has refused a key given twice). A null n is an empty mapping.
func (p *parser) mapping(n *yaml.Node, allowed []string, f func(key string, v *yaml.Node) error) error {
	n, err := p.collection(n, yaml.MappingNode, "a mapping of "+strings.Join(allowed, ", "))
	if n == nil {
		return err
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		if k.Kind != yaml.ScalarNode || k.Tag != "!!str" && k.Tag != "" {
			return p.errorf(k, "a key must be text, not %s", describe(k))
		}
		if !slices.Contains(allowed, k.Value) {
			if !p.lc.Strict && knownKeys[k.Value] {
				if p.lc.Warn != nil {
					p.lc.Warn(p.errorf(k, "key %q is ignored here (want one of %s)", k.Value, strings.Join(allowed, ", ")).(*ConfigError))
				}
				continue
			}
			return p.errorf(k, "unknown key %q (want one of %s)", k.Value, strings.Join(allowed, ", "))
		}
		if err := f(k.Value, n.Content[i+1]); err != nil {
			return err
		}
	}
	return nil
}

// describe names n's kind for errors.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return fmt.Sprintf("%q", n.Value)
}

// scalar returns n resolved, and an error unless it is a scalar.
func (p *parser) scalar(n *yaml.Node, want string) (*yaml.Node, error) {
	n = yamlfile.Deref(n)
	if n.Kind != yaml.ScalarNode {
		return nil, p.errorf(n, "want %s, not %s", want, describe(n))
	}
	return n, nil
}

// str reads a scalar as text, as envoyproxy/ratelimit does: whatever its
// type, its text; null is "".
func (p *parser) str(n *yaml.Node) (string, error) {
	n, err := p.scalar(n, "text")
	if err != nil || isNull(n) {
		return "", err
	}
	return n.Value, nil
}

// boolean reads true or false, and YAML 1.1's yes, no, on, off, y and n;
// null is false.
func (p *parser) boolean(n *yaml.Node) (bool, error) {
	n, err := p.scalar(n, "true or false")
	if err != nil || isNull(n) {
		return false, err
	}
	switch strings.ToLower(n.Value) {
	case "true", "yes", "on", "y":
		return true, nil
	case "false", "no", "off", "n":
		return false, nil
	}
	return false, p.errorf(n, "want true or false, not %q", n.Value)
}

// count reads a whole number in [0, 2^32); null is 0.
func (p *parser) count(n *yaml.Node) (uint32, error) {
	n, err := p.scalar(n, "a whole number")
	if err != nil || isNull(n) {
		return 0, err
	}
	if n.Tag != "!!int" {
		return 0, p.errorf(n, "want a whole number, not %q", n.Value)
	}
	v, err := strconv.ParseUint(strings.ReplaceAll(n.Value, "_", ""), 0, 32)
	if err != nil {
		return 0, p.errorf(n, "%q is not a whole number in [0, %d]", n.Value, uint32(1<<32-1))
	}
	return uint32(v), nil
}

// list calls f with each item of the sequence n; null is empty.
func (p *parser) list(n *yaml.Node, f func(item *yaml.Node) error) error {
	n, err := p.collection(n, yaml.SequenceNode, "a list")
	if n == nil {
		return err
	}
	for _, it := range n.Content {
		if err := f(it); err != nil {
			return err
		}
	}
	return nil
}

var descriptorKeys = []string{"key", "value", "rate_limit", "descriptors", "shadow_mode", "quota_mode",
	"detailed_metric", "value_to_metric", "share_threshold", "metadata"}

var rateLimitKeys = []string{"unit", "requests_per_unit", "unlimited", "name", "replaces"}

// descriptors reads a list of descriptors.
func (p *parser) descriptors(n *yaml.Node) ([]*Descriptor, error) {
	var out []*Descriptor
	err := p.list(n, func(it *yaml.Node) error {
		ds := &Descriptor{Line: it.Line}
		flags := map[string]*bool{"shadow_mode": &ds.ShadowMode, "quota_mode": &ds.QuotaMode,
			"detailed_metric": &ds.DetailedMetric, "value_to_metric": &ds.ValueToMetric, "share_threshold": &ds.ShareThreshold}
		err := p.mapping(it, descriptorKeys, func(key string, v *yaml.Node) error {
			if f := flags[key]; f != nil {
				var err error
				*f, err = p.boolean(v)
				return err
			}
			var err error
			switch key {
			case "key":
				ds.Key, err = p.str(v)
			case "value":
				ds.Value, err = p.str(v)
			case "rate_limit":
				ds.RateLimit, err = p.rateLimit(v)
			case "descriptors":
				ds.Descriptors, err = p.descriptors(v)
			case "metadata":
				ds.Metadata, err = p.metadata(v)
			}
			return err
		})
		out = append(out, ds)
		return err
	})
	return out, err
}

// metadata reads a descriptor's metadata, any mapping, as a structure;
// null is none. The reader has bounded its size.
func (p *parser) metadata(n *yaml.Node) (*structpb.Struct, error) {
	n, err := p.collection(n, yaml.MappingNode, "a mapping")
	if n == nil {
		return nil, err
	}
	var m map[string]any
	if err := n.Decode(&m); err != nil {
		return nil, p.errorf(n, "metadata: %v", err)
	}
	st, err := structpb.NewStruct(m)
	if err != nil {
		return nil, p.errorf(n, "metadata: %v", err)
	}
	return st, nil
}

// rateLimit reads a rate_limit block; null is none.
func (p *parser) rateLimit(n *yaml.Node) (*RateLimit, error) {
	if isNull(yamlfile.Deref(n)) {
		return nil, nil
	}
	rl := &RateLimit{}
	err := p.mapping(n, rateLimitKeys, func(key string, v *yaml.Node) error {
		var err error
		switch key {
		case "unit":
			var s string
			if s, err = p.str(v); err == nil && s != "" {
				var ok bool
				if rl.Unit, ok = ParseUnit(s); !ok {
					err = p.errorf(v, "invalid rate limit unit %q: want second, minute, hour, day, week, month or year", s)
				}
			}
		case "requests_per_unit":
			rl.RequestsPerUnit, err = p.count(v)
		case "unlimited":
			rl.Unlimited, err = p.boolean(v)
		case "name":
			rl.Name, err = p.str(v)
		case "replaces":
			err = p.list(v, func(it *yaml.Node) error {
				var name string
				err := p.mapping(it, []string{"name"}, func(_ string, v *yaml.Node) error {
					var err error
					name, err = p.str(v)
					return err
				})
				rl.Replaces = append(rl.Replaces, name)
				return err
			})
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return rl, nil
}

// LoadDir reads every configuration file of dir: the files named *.yaml
// or *.yml, not those whose name starts with '.' (such as the ..data
// links of a Kubernetes ConfigMap volume), nor subdirectories. Each file
// configures one domain; a domain configured by two files is an error
// wrapping ErrDuplicateDomain. The first invalid file fails the load.
// LoadDir is strict, as ParseDomain; LoadDirWith reads under a
// LoadConfig.
func LoadDir(dir string) (*Rules, error) { return LoadDirWith(dir, LoadConfig{Strict: true}) }

// LoadDirWith reads every configuration file of dir as LoadDir does,
// under lc.
func LoadDirWith(dir string, lc LoadConfig) (*Rules, error) {
	files, err := configFiles(dir)
	if err != nil {
		return nil, err
	}
	return parseFiles(files, lc)
}

// parseFiles parses the files of a directory into its rules.
func parseFiles(files []configFile, lc LoadConfig) (*Rules, error) {
	domains := make([]*Domain, 0, len(files))
	for _, f := range files {
		d, err := ParseDomainWith(f.path, f.data, lc)
		if err != nil {
			return nil, err
		}
		domains = append(domains, d)
	}
	if lc.MergeDomains {
		return MergeRules(domains...)
	}
	return NewRules(domains...)
}

// configFile is one file LoadDir reads.
type configFile struct {
	path string
	data []byte
}

// configFiles reads the configuration files of dir, in name order.
func configFiles(dir string) ([]configFile, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("envoyrls: %w", err)
	}
	var out []configFile
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !(strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")) {
			continue
		}
		path := filepath.Join(dir, name)
		if fi, err := os.Stat(path); err != nil || fi.IsDir() {
			continue // a dangling link, or a directory: not a file to read
		}
		if len(out) == MaxDirFiles {
			return nil, &ConfigError{File: dir, Err: ErrInvalidConfig, Message: fmt.Sprintf("more than %d configuration files", MaxDirFiles)}
		}
		data, err := readFile(path)
		if err != nil {
			return nil, err
		}
		out = append(out, configFile{path, data})
	}
	return out, nil
}

// readFile reads path, refusing one longer than MaxFileBytes without
// reading the rest of it.
func readFile(path string) ([]byte, error) {
	data, err := yamlfile.ReadFile(path, readerConfig)
	if err != nil {
		return nil, readerError(path, err)
	}
	return data, nil
}
