// Package rls holds the configuration of Envoy's rate limit service in
// envoyproxy/ratelimit's YAML format: loading and validating a directory
// of files, and finding the limit of a request's descriptor as
// envoyproxy/ratelimit finds it. Each limit is a policy.Rule (see
// policy.Standalone), so that a server counts it with the same algorithms
// and store keys as a divvy rule file's.
//
// It is pure apart from Load, which reads the directory: no clock, no
// lock, no package-level mutable state. A *Config is immutable and safe
// for concurrent use; Find allocates nothing.
//
// # Format
//
// A file is one YAML document: a mapping with `domain` (required, not
// empty) and `descriptors`, a list of descriptors. A descriptor has `key`
// (required), optionally `value`, `rate_limit`, `descriptors` (nested, to
// any depth), `shadow_mode` and `detailed_metric`. A `rate_limit` has
// `unit` (second, minute, hour, day, week, month or year, in any letter
// case; month is 30 days and year 365, as in envoyproxy/ratelimit) and
// `requests_per_unit`, or `unlimited: true` and no unit; optionally `name`
// and `replaces`, a list of `{name: ...}`. sluice adds `algorithm`
// (fixed_window, the default; token_bucket, gcra or sliding_log), `burst`
// (token_bucket and gcra: the most requests at once; the limit when left
// out) and `max_requests_per_unit` (a request's limit override in the
// limit's unit applies to this limit, up to it; see Limit.MaxOverride).
//
// Loading fails with a *ConfigError naming the file, the line and the
// first problem: YAML syntax, a field unknown at its place, a field given
// twice, a value of the wrong type, an empty domain or key, a domain in two
// files, two descriptors with the same key and value under one parent, a
// missing or unknown unit, a unit with unlimited, an empty replaces name or
// one naming its own limit, and sluice's own: burst with another
// algorithm, a sliding_log over bucket.MaxLogMax, max_requests_per_unit 0
// or with unlimited, and the envoyproxy
// fields sluice does not implement (quota_mode, value_to_metric,
// share_threshold, metadata), which are refused rather than ignored.
package rls

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/sluicehq/sluice/policy"
)

// Unit is a rate limit's unit, as the number of seconds of its window.
type Unit int64

// The units of envoyproxy/ratelimit, with its lengths.
const (
	Second Unit = 1
	Minute Unit = 60
	Hour   Unit = 3600
	Day    Unit = 86400
	Week   Unit = 7 * 86400
	Month  Unit = 30 * 86400
	Year   Unit = 365 * 86400
)

// units are the units by name, with their values in Envoy's enum
// (RateLimitResponse.RateLimit.Unit; RateLimitOverride's
// envoy.type.v3.RateLimitUnit has the same values).
var units = []struct {
	name string
	unit Unit
	enum int32
}{{"second", Second, 1}, {"minute", Minute, 2}, {"hour", Hour, 3}, {"day", Day, 4}, {"week", Week, 7}, {"month", Month, 5}, {"year", Year, 6}}

// String returns the unit's name in upper case, as Envoy's enum names it.
func (u Unit) String() string {
	for _, x := range units {
		if x.unit == u {
			return strings.ToUpper(x.name)
		}
	}
	return fmt.Sprintf("Unit(%d)", int64(u))
}

// Enum is u's value in Envoy's RateLimitResponse.RateLimit.Unit; 0
// (UNKNOWN) for another duration.
func (u Unit) Enum() int32 {
	for _, x := range units {
		if x.unit == u {
			return x.enum
		}
	}
	return 0
}

// UnitOfEnum is the unit of Envoy's enum value e; ok is false for UNKNOWN
// and values it does not define.
func UnitOfEnum(e int32) (u Unit, ok bool) {
	for _, x := range units {
		if x.enum == e {
			return x.unit, true
		}
	}
	return 0, false
}

// Field names of the request a server hands policy for a limit's rule.
const (
	// DescriptorField holds the request's descriptor entries, encoded by
	// AppendDescriptor: the rules' actor field, so that each descriptor
	// value has its counter, as envoyproxy/ratelimit's cache key is built
	// from the domain and every entry.
	DescriptorField = "descriptor"
	// OverrideField holds the requests_per_unit of a descriptor's limit
	// override, in decimal: the quota field of the override rules.
	OverrideField = "requests_per_unit"
)

// OverrideLabelPrefix starts the label a domain's per-descriptor
// overrides are kept under (OverrideLabel). A rule file's labels have no
// ':', so the two never meet.
const OverrideLabelPrefix = "rls:"

// OverrideLabel is the label the per-descriptor overrides of domain
// (RLS.OVERRIDE) are kept under, with the descriptor's entries, encoded
// by AppendDescriptor, as the actor: the override records and counts of
// a rule file's per-actor overrides, keyed by domain and entries.
func OverrideLabel(domain string) string { return OverrideLabelPrefix + domain }

// Limit is one descriptor path's rate_limit.
type Limit struct {
	Domain string
	// Key is the path below the domain as envoyproxy/ratelimit's metrics
	// name it: key or key_value per level, joined with dots
	// ("to_number.from_number").
	Key string
	// Depth is the number of levels of the path below the domain: the
	// number of entries of the descriptors the limit applies to.
	Depth           int
	RequestsPerUnit uint32
	Unit            Unit
	Name            string
	Replaces        []string
	// MaxOverride, sluice's max_requests_per_unit, lets a request's limit
	// override (RateLimitOverride) in the limit's unit change this
	// limit, with its algorithm and counter, up to MaxOverride; 0: an
	// override is counted apart, as in envoyproxy/ratelimit.
	MaxOverride    uint32
	Unlimited      bool
	ShadowMode     bool
	DetailedMetric bool
	// Rule counts the limit; nil when Unlimited.
	Rule *policy.Rule
	File string
	Line int // of the descriptor's key
}

// Entry is one entry of a request's descriptor.
type Entry struct {
	Key, Value string
}

// node is one level of a domain's descriptor tree.
type node struct {
	exact   map[Entry]*node  // key and value
	keyOnly map[string]*node // key without value: any value
	wild    []wildNode       // values with `*`, in file order
	limit   *Limit
}

type wildNode struct {
	key   string
	parts []string // the value split at each `*`
	n     *node
}

func (n *node) children() bool { return len(n.exact)+len(n.keyOnly)+len(n.wild) > 0 }

// Config is a loaded configuration: its domains and their limits.
type Config struct {
	domains   map[string]*node
	limits    []*Limit
	rules     []*policy.Rule
	overrides map[string]*[7]*policy.Rule // by domain, in the order of units
	files     []string
}

// Limits returns every limit, in file order.
func (c *Config) Limits() []*Limit { return c.limits }

// Rules returns the rules that count the limits and the overrides; their
// Pos is their index + 1.
func (c *Config) Rules() []*policy.Rule { return c.rules }

// Files returns the files loaded, in the order read.
func (c *Config) Files() []string { return c.files }

// Domains returns how many domains the configuration has.
func (c *Config) Domains() int { return len(c.domains) }

// HasDomain reports whether domain is configured.
func (c *Config) HasDomain(domain string) bool { return c.domains[domain] != nil }

// Find returns the limit of a descriptor as envoyproxy/ratelimit finds
// it, or nil: each entry in turn goes to the child with its key and value,
// else to the first wildcard child whose pattern matches its value, else
// to the child with its key alone; the limit is that of the node the last
// entry reaches. A descriptor with more entries than the path has, or one
// that leaves the tree, has none.
func (c *Config) Find(domain string, entries []Entry) *Limit {
	n := c.domains[domain]
	if n == nil {
		return nil
	}
	var found *Limit
	for i, e := range entries {
		var next *node
		if e.Value != "" {
			next = n.exact[e]
		}
		if next == nil {
			for j := range n.wild {
				if w := &n.wild[j]; w.key == e.Key && wildMatch(w.parts, e.Value) {
					next = w.n
					break
				}
			}
		}
		if next == nil {
			next = n.keyOnly[e.Key]
		}
		if next == nil {
			return nil
		}
		if i == len(entries)-1 {
			found = next.limit
		}
		if !next.children() {
			break
		}
		n = next
	}
	return found
}

// Override returns the rule that counts a descriptor's limit override in
// unit (Envoy's RateLimitOverride): a fixed window of the unit whose limit
// is the request's OverrideField. It is nil when domain is not
// configured, as envoyproxy/ratelimit applies overrides only in known
// domains.
func (c *Config) Override(domain string, unit Unit) *policy.Rule {
	o := c.overrides[domain]
	if o == nil {
		return nil
	}
	for i, x := range units {
		if x.unit == unit {
			return o[i]
		}
	}
	return nil
}

// wildMatch reports whether v matches a value split at its `*`s: each
// `*` matches any run of bytes, the empty one included.
func wildMatch(parts []string, v string) bool {
	if len(parts) == 1 {
		return parts[0] == v
	}
	first, last := parts[0], parts[len(parts)-1]
	if len(v) < len(first)+len(last) || !strings.HasPrefix(v, first) || !strings.HasSuffix(v, last) {
		return false
	}
	rest := v[len(first) : len(v)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}

// AppendDescriptor appends the encoding of a descriptor's entries that
// identifies its counter: each key and value with its length in front, so
// that no two descriptors encode alike.
func AppendDescriptor(dst []byte, entries []Entry) []byte {
	for _, e := range entries {
		dst = appendLenString(dst, e.Key)
		dst = appendLenString(dst, e.Value)
	}
	return dst
}

// ParseDescriptor decodes the entries AppendDescriptor encoded; ok is
// false for bytes it cannot have made.
func ParseDescriptor(b []byte) (entries []Entry, ok bool) {
	for len(b) > 0 {
		var k, v string
		if k, b, ok = cutLenString(b); !ok {
			return nil, false
		}
		if v, b, ok = cutLenString(b); !ok {
			return nil, false
		}
		entries = append(entries, Entry{Key: k, Value: v})
	}
	return entries, true
}

func cutLenString(b []byte) (s string, rest []byte, ok bool) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)-k) {
		return "", nil, false
	}
	return string(b[k : k+int(n)]), b[k+int(n):], true
}

// DescriptorLen is len(AppendDescriptor(nil, entries)), without building
// it.
func DescriptorLen(entries []Entry) int {
	n := 0
	for _, e := range entries {
		n += uvarintLen(len(e.Key)) + len(e.Key) + uvarintLen(len(e.Value)) + len(e.Value)
	}
	return n
}

func uvarintLen(n int) int {
	l := 1
	for n >= 0x80 {
		n >>= 7
		l++
	}
	return l
}

func appendLenString(dst []byte, s string) []byte {
	n := uint64(len(s))
	for n >= 0x80 {
		dst = append(dst, byte(n)|0x80)
		n >>= 7
	}
	dst = append(dst, byte(n))
	return append(dst, s...)
}

// MetricKey appends the key of a detailed_metric limit's metrics for a
// request: key_value per entry, joined with dots, as envoyproxy/ratelimit
// names them (the domain left out: it is a label of its own).
func MetricKey(dst []byte, entries []Entry) []byte {
	for i, e := range entries {
		if i > 0 {
			dst = append(dst, '.')
		}
		dst = append(dst, e.Key...)
		if e.Value != "" {
			dst = append(dst, '_')
			dst = append(dst, e.Value...)
		}
	}
	return dst
}
