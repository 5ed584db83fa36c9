package rls

import (
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/conffile"
	"github.com/sluicehq/sluice/policy"
)

// ConfigError is a configuration that cannot be used: the first problem
// found, in the order the files are read; the whole configuration is
// rejected.
type ConfigError struct {
	File    string // "" when about the directory
	Line    int    // 1-based; 0 when not about one line
	Problem string
}

// Error returns "rls: file:line: problem".
func (e *ConfigError) Error() string {
	var b strings.Builder
	b.WriteString("rls: ")
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			fmt.Fprintf(&b, ":%d", e.Line)
		}
		b.WriteString(": ")
	}
	b.WriteString(e.Problem)
	return b.String()
}

// File is one configuration file's name and content.
type File struct {
	Name string
	Data []byte
}

// Load reads every *.yaml and *.yml file of dir (not its subdirectories),
// in name order, and parses them together. Each must be a regular file
// (or a symlink to one), and together they may hold at most maxBytes
// (0 or less: conffile.DefaultLimit), so that a named pipe or a device
// cannot block or exhaust a reload.
func Load(dir string, maxBytes int64) (*Config, error) {
	if maxBytes <= 0 {
		maxBytes = conffile.DefaultLimit
	}
	ents, err := conffile.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("rls: %w", err)
	}
	var files []File
	var total int64
	for _, e := range ents {
		ext := strings.ToLower(filepath.Ext(e.Name()))
		if e.IsDir() || ext != ".yaml" && ext != ".yml" {
			continue
		}
		name := filepath.Join(dir, e.Name())
		data, err := conffile.Read(name, maxBytes)
		if err != nil {
			return nil, fmt.Errorf("rls: %w", err)
		}
		if total += int64(len(data)); total > maxBytes {
			return nil, &ConfigError{Problem: fmt.Sprintf("the *.yaml and *.yml files of %s hold %d bytes up to %s, %d over the limit of %d for them together (--max-config-file); expected fewer or smaller files, or a higher limit", dir, total, e.Name(), total-maxBytes, maxBytes)}
		}
		files = append(files, File{Name: name, Data: data})
	}
	if len(files) == 0 {
		return nil, &ConfigError{Problem: fmt.Sprintf("%s holds no *.yaml or *.yml file; expected at least one configuration file with a domain", dir)}
	}
	return Parse(files)
}

// maxNodes bounds the YAML nodes one file may expand to, aliases
// followed, so that a small file of nested aliases cannot take the
// process's memory.
const maxNodes = 1 << 20

// Parse parses configuration files, each with one domain.
func Parse(files []File) (*Config, error) {
	c := &Config{domains: make(map[string]*node), overrides: make(map[string]*[7]*policy.Rule)}
	domainFile := make(map[string]string)
	var rules []policy.Rule
	var ruleLimits []*Limit
	for _, f := range files {
		p := &parser{file: f.Name}
		var doc yaml.Node
		dec := yaml.NewDecoder(strings.NewReader(string(f.Data)))
		if err := dec.Decode(&doc); err != nil {
			if errors.Is(err, io.EOF) {
				return nil, p.fail(0, "the file is empty; expected a mapping with domain and descriptors")
			}
			return nil, p.fail(0, "YAML: %v", err)
		}
		var more yaml.Node
		if err := dec.Decode(&more); err == nil {
			return nil, p.fail(more.Line, "a second YAML document; expected one domain per file")
		}
		root := &doc
		if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
			root = root.Content[0]
		}
		fields, err := p.mapping(root, "the file", rootFields)
		if err != nil {
			return nil, err
		}
		dn := fields["domain"]
		if dn == nil {
			return nil, p.fail(root.Line, "no domain; expected domain: NAME")
		}
		domain, err := p.str(dn, "domain")
		if err != nil {
			return nil, err
		}
		if domain == "" {
			return nil, p.fail(dn.Line, "domain is empty; expected a name")
		}
		if prev, dup := domainFile[domain]; dup {
			return nil, p.fail(dn.Line, "domain %q is already configured in %s; each domain must be in one file", domain, prev)
		}
		domainFile[domain] = f.Name
		top := &node{}
		if d := fields["descriptors"]; d != nil {
			if err := p.descriptors(d, top, domain, "", 1); err != nil {
				return nil, err
			}
		}
		c.domains[domain] = top
		c.files = append(c.files, f.Name)
		for _, l := range p.limits {
			ruleLimits = append(ruleLimits, l)
			if !l.Unlimited {
				rules = append(rules, p.rules[l])
			}
		}
	}
	// Overrides: one rule per domain and unit, in domain order, after the
	// limits.
	domains := make([]string, 0, len(c.domains))
	for d := range c.domains {
		domains = append(domains, d)
	}
	slices.Sort(domains)
	for _, d := range domains {
		for _, u := range units {
			rules = append(rules, policy.Rule{
				Operation:    []policy.Pair{{Key: "domain", Value: d}, {Key: "override", Value: u.name}},
				ResetSeconds: int64(u.unit),
				Algorithm:    policy.FixedWindow,
				QuotaField:   OverrideField,
				MaxQuota:     math.MaxUint32,
				ActorField:   DescriptorField,
				Label:        "override",
			})
		}
	}
	c.rules = policy.Standalone("rls", rules)
	i := 0
	for _, l := range ruleLimits {
		c.limits = append(c.limits, l)
		if !l.Unlimited {
			l.Rule = c.rules[i]
			i++
		}
	}
	for _, d := range domains {
		o := new([7]*policy.Rule)
		for j := range o {
			o[j] = c.rules[i]
			i++
		}
		c.overrides[d] = o
	}
	return c, nil
}

// Fields by place: what each mapping may hold. sluice's own are marked.
var (
	rootFields       = []string{"domain", "descriptors"}
	descriptorFields = []string{"key", "value", "rate_limit", "descriptors", "shadow_mode", "detailed_metric"}
	rateLimitFields  = []string{"unit", "requests_per_unit", "unlimited", "name", "replaces", "algorithm", "burst", "max_requests_per_unit"}
	replacesFields   = []string{"name"}
	// unsupported are envoyproxy/ratelimit's fields sluice refuses rather
	// than ignore, since ignoring them would change what a limit does.
	unsupported = map[string]string{
		"quota_mode":      "quota_mode is not supported by sluice; see docs/envoy.md",
		"value_to_metric": "value_to_metric is not supported by sluice (use detailed_metric); see docs/envoy.md",
		"share_threshold": "share_threshold is not supported by sluice: every value matched by a wildcard has its own counter; see docs/envoy.md",
		"metadata":        "metadata is not supported by sluice; see docs/envoy.md",
	}
)

type parser struct {
	file   string
	nodes  int
	limits []*Limit
	rules  map[*Limit]policy.Rule
}

func (p *parser) fail(line int, format string, args ...any) *ConfigError {
	return &ConfigError{File: p.file, Line: line, Problem: fmt.Sprintf(format, args...)}
}

// deref follows an alias, counting the nodes an alias expands to.
func (p *parser) deref(n *yaml.Node) (*yaml.Node, error) {
	for n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	p.nodes++
	if p.nodes > maxNodes {
		return nil, p.fail(n.Line, "the file expands to more than %d YAML nodes (aliases followed); expected a smaller configuration", maxNodes)
	}
	return n, nil
}

// mapping reads a mapping whose keys must be in allowed, refusing
// duplicates; what names the mapping in messages.
func (p *parser) mapping(n *yaml.Node, what string, allowed []string) (map[string]*yaml.Node, error) {
	n, err := p.deref(n)
	if err != nil {
		return nil, err
	}
	if n.Kind != yaml.MappingNode {
		return nil, p.fail(n.Line, "%s is a %s; expected a mapping with %s", what, kindName(n), strings.Join(allowed, ", "))
	}
	out := make(map[string]*yaml.Node, len(n.Content)/2)
	lines := make(map[string]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, err := p.deref(n.Content[i])
		if err != nil {
			return nil, err
		}
		if k.Kind != yaml.ScalarNode {
			return nil, p.fail(k.Line, "a key of %s is a %s; expected a name", what, kindName(k))
		}
		if k.Value == "<<" {
			return nil, p.fail(k.Line, "merge keys (<<) are not supported; write the fields out")
		}
		if msg, ok := unsupported[k.Value]; ok {
			return nil, p.fail(k.Line, "%s", msg)
		}
		if !slices.Contains(allowed, k.Value) {
			return nil, p.fail(k.Line, "unknown key %q in %s; expected one of %s", k.Value, what, strings.Join(allowed, ", "))
		}
		if l, dup := lines[k.Value]; dup {
			return nil, p.fail(k.Line, "%s is given twice in %s (first on line %d)", k.Value, what, l)
		}
		lines[k.Value] = k.Line
		out[k.Value] = n.Content[i+1]
	}
	return out, nil
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "list"
	case yaml.ScalarNode:
		if n.ShortTag() == "!!null" {
			return "null"
		}
		return "scalar"
	}
	return "document"
}

// str reads a scalar as text, as envoyproxy/ratelimit's string fields
// take numbers and booleans as written. Null is the empty string.
func (p *parser) str(n *yaml.Node, name string) (string, error) {
	n, err := p.deref(n)
	if err != nil {
		return "", err
	}
	if n.Kind != yaml.ScalarNode {
		return "", p.fail(n.Line, "%s is a %s; expected a string", name, kindName(n))
	}
	if n.ShortTag() == "!!null" {
		return "", nil
	}
	return n.Value, nil
}

func (p *parser) boolean(n *yaml.Node, name string) (bool, error) {
	n, err := p.deref(n)
	if err != nil {
		return false, err
	}
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" {
		return false, p.fail(n.Line, "%s is %q; expected true or false", name, n.Value)
	}
	var b bool
	if err := n.Decode(&b); err != nil {
		return false, p.fail(n.Line, "%s is %q; expected true or false", name, n.Value)
	}
	return b, nil
}

func (p *parser) integer(n *yaml.Node, name string, max uint64) (uint64, error) {
	n, err := p.deref(n)
	if err != nil {
		return 0, err
	}
	var v uint64
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || n.Decode(&v) != nil || v > max {
		return 0, p.fail(n.Line, "%s is %q; expected an integer from 0 to %d", name, n.Value, max)
	}
	return v, nil
}

// descriptors reads a list of descriptors into parent, whose key (the
// path from the domain) is parentKey.
func (p *parser) descriptors(n *yaml.Node, parent *node, domain, parentKey string, depth int) error {
	n, err := p.deref(n)
	if err != nil {
		return err
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		return p.fail(n.Line, "descriptors is a %s; expected a list of descriptors (- key: ...)", kindName(n))
	}
	for _, item := range n.Content {
		item, err := p.deref(item)
		if err != nil {
			return err
		}
		fields, err := p.mapping(item, "a descriptor", descriptorFields)
		if err != nil {
			return err
		}
		kn := fields["key"]
		if kn == nil {
			return p.fail(item.Line, "a descriptor has no key; expected key: NAME")
		}
		key, err := p.str(kn, "key")
		if err != nil {
			return err
		}
		if key == "" {
			return p.fail(kn.Line, "descriptor has empty key")
		}
		var value string
		if vn := fields["value"]; vn != nil {
			if value, err = p.str(vn, "value"); err != nil {
				return err
			}
		}
		name := key
		if value != "" {
			name += "_" + value
		}
		full := name
		if parentKey != "" {
			full = parentKey + "." + name
		}
		child := &node{}
		switch {
		case value == "":
			if parent.keyOnly[key] != nil {
				return p.fail(kn.Line, "duplicate descriptor composite key '%s.%s'", domain, full)
			}
			if parent.keyOnly == nil {
				parent.keyOnly = make(map[string]*node)
			}
			parent.keyOnly[key] = child
		case strings.Contains(value, "*"):
			for _, w := range parent.wild {
				if w.key == key && strings.Join(w.parts, "*") == value {
					return p.fail(kn.Line, "duplicate descriptor composite key '%s.%s'", domain, full)
				}
			}
			parent.wild = append(parent.wild, wildNode{key: key, parts: strings.Split(value, "*"), n: child})
		default:
			e := Entry{Key: key, Value: value}
			if parent.exact[e] != nil {
				return p.fail(kn.Line, "duplicate descriptor composite key '%s.%s'", domain, full)
			}
			if parent.exact == nil {
				parent.exact = make(map[Entry]*node)
			}
			parent.exact[e] = child
		}
		var shadow, detailed bool
		if b := fields["shadow_mode"]; b != nil {
			if shadow, err = p.boolean(b, "shadow_mode"); err != nil {
				return err
			}
		}
		if b := fields["detailed_metric"]; b != nil {
			if detailed, err = p.boolean(b, "detailed_metric"); err != nil {
				return err
			}
		}
		if rl := fields["rate_limit"]; rl != nil {
			l, r, err := p.rateLimit(rl, domain, full)
			if err != nil {
				return err
			}
			l.ShadowMode, l.DetailedMetric, l.Line, l.Depth = shadow, detailed, kn.Line, depth
			child.limit = l
			p.limits = append(p.limits, l)
			if p.rules == nil {
				p.rules = make(map[*Limit]policy.Rule)
			}
			p.rules[l] = r
		}
		if d := fields["descriptors"]; d != nil {
			if err := p.descriptors(d, child, domain, full, depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

// Algorithms by their names in the YAML.
var algorithms = map[string]policy.Algorithm{
	"fixed_window": policy.FixedWindow,
	"token_bucket": policy.TokenBucket,
	"gcra":         policy.GCRA,
	"sliding_log":  policy.SlidingLog,
}

func (p *parser) rateLimit(n *yaml.Node, domain, key string) (*Limit, policy.Rule, error) {
	n, err := p.deref(n)
	if err != nil {
		return nil, policy.Rule{}, err
	}
	fields, err := p.mapping(n, "rate_limit", rateLimitFields)
	if err != nil {
		return nil, policy.Rule{}, err
	}
	l := &Limit{Domain: domain, Key: key, File: p.file}
	if u := fields["unlimited"]; u != nil {
		if l.Unlimited, err = p.boolean(u, "unlimited"); err != nil {
			return nil, policy.Rule{}, err
		}
	}
	if rpu := fields["requests_per_unit"]; rpu != nil {
		v, err := p.integer(rpu, "requests_per_unit", math.MaxUint32)
		if err != nil {
			return nil, policy.Rule{}, err
		}
		l.RequestsPerUnit = uint32(v)
	}
	unitName := ""
	if un := fields["unit"]; un != nil {
		if unitName, err = p.str(un, "unit"); err != nil {
			return nil, policy.Rule{}, err
		}
	}
	for _, u := range units {
		if strings.EqualFold(unitName, u.name) {
			l.Unit = u.unit
		}
	}
	switch {
	case l.Unlimited && l.Unit != 0:
		return nil, policy.Rule{}, p.fail(fields["unit"].Line, "should not specify rate limit unit when unlimited")
	case !l.Unlimited && l.Unit == 0:
		line := n.Line
		if fields["unit"] != nil {
			line = fields["unit"].Line
		}
		return nil, policy.Rule{}, p.fail(line, "invalid rate limit unit '%s'; expected second, minute, hour, day, week, month or year", unitName)
	}
	if nn := fields["name"]; nn != nil {
		if l.Name, err = p.str(nn, "name"); err != nil {
			return nil, policy.Rule{}, err
		}
	}
	if rn := fields["replaces"]; rn != nil {
		rn, err := p.deref(rn)
		if err != nil {
			return nil, policy.Rule{}, err
		}
		if rn.Kind != yaml.SequenceNode {
			return nil, policy.Rule{}, p.fail(rn.Line, "replaces is a %s; expected a list of {name: ...}", kindName(rn))
		}
		for _, e := range rn.Content {
			f, err := p.mapping(e, "a replaces entry", replacesFields)
			if err != nil {
				return nil, policy.Rule{}, err
			}
			name := ""
			if f["name"] != nil {
				if name, err = p.str(f["name"], "name"); err != nil {
					return nil, policy.Rule{}, err
				}
			}
			if name == "" {
				return nil, policy.Rule{}, p.fail(e.Line, "should not have an empty replaces entry")
			}
			if name == l.Name {
				return nil, policy.Rule{}, p.fail(e.Line, "replaces should not contain name of same descriptor (%q)", name)
			}
			l.Replaces = append(l.Replaces, name)
		}
	}
	alg := policy.FixedWindow
	if an := fields["algorithm"]; an != nil {
		s, err := p.str(an, "algorithm")
		if err != nil {
			return nil, policy.Rule{}, err
		}
		a, ok := algorithms[s]
		if !ok {
			return nil, policy.Rule{}, p.fail(an.Line, "algorithm is %q; expected fixed_window, token_bucket, gcra or sliding_log", s)
		}
		alg = a
	}
	var burst uint64
	if bn := fields["burst"]; bn != nil {
		if alg != policy.TokenBucket && alg != policy.GCRA {
			return nil, policy.Rule{}, p.fail(bn.Line, "burst applies only to algorithms token_bucket and gcra")
		}
		if burst, err = p.integer(bn, "burst", math.MaxUint32); err != nil {
			return nil, policy.Rule{}, err
		}
		if burst == 0 {
			return nil, policy.Rule{}, p.fail(bn.Line, "burst is 0; expected a positive integer (leave it out for a burst of requests_per_unit)")
		}
	}
	if alg == policy.SlidingLog && int64(l.RequestsPerUnit) > bucket.MaxLogMax {
		return nil, policy.Rule{}, p.fail(fields["requests_per_unit"].Line, "requests_per_unit is %d; a sliding_log keeps every request of its unit, expected at most %d", l.RequestsPerUnit, bucket.MaxLogMax)
	}
	if mn := fields["max_requests_per_unit"]; mn != nil {
		v, err := p.integer(mn, "max_requests_per_unit", math.MaxUint32)
		if err != nil {
			return nil, policy.Rule{}, err
		}
		switch {
		case l.Unlimited:
			return nil, policy.Rule{}, p.fail(mn.Line, "max_requests_per_unit does not apply to an unlimited rate_limit")
		case v == 0:
			return nil, policy.Rule{}, p.fail(mn.Line, "max_requests_per_unit is 0; expected a positive integer, the most a request's limit override may ask for")
		case alg == policy.SlidingLog && int64(v) > bucket.MaxLogMax:
			return nil, policy.Rule{}, p.fail(mn.Line, "max_requests_per_unit is %d; a sliding_log keeps every request of its unit, expected at most %d", v, bucket.MaxLogMax)
		}
		l.MaxOverride = uint32(v)
	}
	if l.Unlimited {
		return l, policy.Rule{}, nil
	}
	r := policy.Rule{
		Operation:    []policy.Pair{{Key: "domain", Value: domain}, {Key: "descriptor", Value: key}},
		CreditLimit:  int64(l.RequestsPerUnit),
		ResetSeconds: int64(l.Unit),
		Algorithm:    alg,
		Burst:        int64(burst),
		ActorField:   DescriptorField,
		Label:        l.Name,
		// Per-descriptor overrides (RLS.OVERRIDE) by domain: the
		// descriptor's entries, the actor, find the limit.
		OverrideLabel: OverrideLabel(domain),
	}
	if l.MaxOverride > 0 {
		r.QuotaField, r.MaxQuota = OverrideField, int64(l.MaxOverride)
	}
	if alg == policy.GCRA {
		// Every limit a request may get: its own, the cap, and 1, the
		// smallest override.
		for _, limit := range []int64{r.CreditLimit, r.MaxQuota, 1} {
			if limit <= 0 || limit == 1 && r.MaxQuota == 0 {
				continue
			}
			if _, err := bucket.NewGCRA(r.GCRAParams(limit)); err != nil {
				return nil, policy.Rule{}, p.fail(n.Line, "gcra with %d per %s and burst %d cannot be computed: %v", limit, l.Unit, r.BurstFor(limit), err)
			}
		}
	}
	return l, r, nil
}

// FormatOverride is the request field value of an override's
// requests_per_unit.
func FormatOverride(dst []byte, rpu uint32) []byte { return strconv.AppendUint(dst, uint64(rpu), 10) }
