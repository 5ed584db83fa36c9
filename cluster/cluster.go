// Package cluster is the topology of a sluice cluster: which node owns
// which Redis Cluster hash slots, under which epoch.
//
// sluice runs no gossip or consensus of its own. The initial topology is
// derived from the nodes' announced addresses in ordinal order (a
// StatefulSet's pods), ordinal i owning slots ⌊16384·i/N⌋ to
// ⌊16384·(i+1)/N⌋−1; later topologies are computed outside the nodes
// (sluice cluster rebalance) and pushed to each with a higher epoch, as
// Kvrocks' controller and Dragonfly's DFLYCLUSTER CONFIG do.
//
// A node's ID is derived from its announced address, so every node and
// every tool computes the same ID without asking. The package is pure: no
// I/O, no clock, no locks; a Topology is a value, and safe for concurrent
// reads once built.
package cluster

import (
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Slots is the number of Redis Cluster hash slots.
const Slots = 16384

// ErrBadTopology is wrapped by every error about a topology's text or
// shape.
var ErrBadTopology = errors.New("cluster: bad topology")

// Range is the slots First to Last, both included.
type Range struct{ First, Last uint16 }

// Node is one node of a topology: its ID, the address clients reach it at,
// and the slots it owns, in order.
type Node struct {
	ID    string // 40 hex characters, NodeID(Addr)
	Addr  string // announced host:port
	Slots []Range
}

// Topology is a cluster's nodes and their slots, under an epoch: a node
// takes a pushed topology only with an epoch above the one it has.
type Topology struct {
	Epoch uint64
	Nodes []Node
}

// NodeID derives a node's ID from its announced address: 40 hex
// characters, as Redis Cluster's node IDs, the same on every node and in
// every tool.
func NodeID(addr string) string {
	sum := sha1.Sum([]byte("sluice-node " + addr))
	return hex.EncodeToString(sum[:])
}

// Initial is the topology of nodes at addrs, in ordinal order, at epoch 0:
// ordinal i owns slots ⌊16384·i/N⌋ to ⌊16384·(i+1)/N⌋−1.
func Initial(addrs []string) Topology {
	n := len(addrs)
	t := Topology{Nodes: make([]Node, n)}
	for i, a := range addrs {
		first, end := Slots*i/n, Slots*(i+1)/n
		t.Nodes[i] = Node{ID: NodeID(a), Addr: a}
		if end > first {
			t.Nodes[i].Slots = []Range{{uint16(first), uint16(end - 1)}}
		}
	}
	return t
}

// Owners returns, for each slot, the index in t.Nodes of the node that
// owns it plus one, or 0 when no node does.
func (t Topology) Owners() *[Slots]uint16 {
	var o [Slots]uint16
	for i, n := range t.Nodes {
		for _, r := range n.Slots {
			for s := int(r.First); s <= int(r.Last); s++ {
				o[s] = uint16(i + 1)
			}
		}
	}
	return &o
}

// Index returns the position of the node with id in t.Nodes, or -1.
func (t Topology) Index(id string) int {
	return slices.IndexFunc(t.Nodes, func(n Node) bool { return n.ID == id })
}

// Assigned is the number of slots some node owns.
func (t Topology) Assigned() int {
	n := 0
	for _, nd := range t.Nodes {
		for _, r := range nd.Slots {
			n += int(r.Last) - int(r.First) + 1
		}
	}
	return n
}

// Equal reports whether t and u are the same topology, epoch included.
func (t Topology) Equal(u Topology) bool {
	return t.Epoch == u.Epoch && slices.EqualFunc(t.Nodes, u.Nodes, func(a, b Node) bool {
		return a.ID == b.ID && a.Addr == b.Addr && slices.Equal(a.Slots, b.Slots)
	})
}

// Args is t as the arguments of CLUSTER SETTOPOLOGY: the epoch, then each
// node's address and slot ranges ("0-5460,6000", or "-" for none).
func (t Topology) Args() []string {
	a := []string{strconv.FormatUint(t.Epoch, 10)}
	for _, n := range t.Nodes {
		a = append(a, n.Addr, FormatRanges(n.Slots))
	}
	return a
}

// Encode is t as one line of text, for the store: a version word, then
// Args separated by spaces. Decode reads it back.
func (t Topology) Encode() []byte {
	return []byte("v1 " + strings.Join(t.Args(), " "))
}

// Decode reads a topology Encode wrote. It takes an epoch above MaxEpoch,
// which an earlier version stored, so the node starts and can be
// renumbered (see MaxEpoch).
func Decode(b []byte) (Topology, error) {
	f := strings.Fields(string(b))
	if len(f) == 0 || f[0] != "v1" {
		return Topology{}, fmt.Errorf("%w: stored topology does not start with v1", ErrBadTopology)
	}
	return parse(f[1:], math.MaxUint64)
}

// MaxEpoch is the highest epoch a topology may have. Tools compute the next
// epoch as the current one plus one: an epoch of 2^64−1 (a typo, or a
// hostile push) would wrap and freeze the topology forever. 2^53 leaves
// room for any number of real pushes and is exact in every JSON number.
// A node whose topology has reached MaxEpoch (or, stored by an earlier
// version, is past it) takes a pushed topology of any epoch, so that
// `sluice cluster renumber` can bring the epochs down.
const MaxEpoch = 1 << 53

// ErrEpochCap is the error of a push whose next epoch would pass MaxEpoch.
var ErrEpochCap = errors.New("cluster: epoch at the cap 2^53 (9007199254740992): renumber the topology with `sluice cluster renumber --nodes ...`")

// Parse reads the arguments of CLUSTER SETTOPOLOGY: epoch, then pairs of
// address and slot ranges. Node IDs are derived from the addresses. It
// refuses a slot owned twice, an address given twice, and a malformed
// address or range; slots no node owns are allowed (they answer
// CLUSTERDOWN).
func Parse(args []string) (Topology, error) {
	return parse(args, MaxEpoch)
}

func parse(args []string, maxEpoch uint64) (Topology, error) {
	if len(args) < 3 || len(args)%2 != 1 {
		return Topology{}, fmt.Errorf("%w: want an epoch, then one or more pairs of host:port and slot ranges (e.g. 0-8191,9000 or - for none)", ErrBadTopology)
	}
	epoch, err := strconv.ParseUint(args[0], 10, 64)
	if err != nil {
		return Topology{}, fmt.Errorf("%w: epoch %q: want a non-negative integer", ErrBadTopology, args[0])
	}
	if epoch > maxEpoch {
		return Topology{}, fmt.Errorf("%w: epoch %d: want at most 2^53 (%d); a topology stuck at the cap is renumbered with sluice cluster renumber", ErrBadTopology, epoch, uint64(maxEpoch))
	}
	t := Topology{Epoch: epoch}
	var owned [Slots]bool
	for i := 1; i < len(args); i += 2 {
		addr := args[i]
		if err := CheckAddr(addr); err != nil {
			return Topology{}, err
		}
		if slices.ContainsFunc(t.Nodes, func(n Node) bool { return n.Addr == addr }) {
			return Topology{}, fmt.Errorf("%w: node %s given twice", ErrBadTopology, addr)
		}
		rs, err := ParseRanges(args[i+1])
		if err != nil {
			return Topology{}, fmt.Errorf("node %s: %w", addr, err)
		}
		for _, r := range rs {
			for s := int(r.First); s <= int(r.Last); s++ {
				if owned[s] {
					return Topology{}, fmt.Errorf("%w: slot %d is given to node %s and to an earlier node", ErrBadTopology, s, addr)
				}
				owned[s] = true
			}
		}
		t.Nodes = append(t.Nodes, Node{ID: NodeID(addr), Addr: addr, Slots: rs})
	}
	return t, nil
}

// CheckAddr refuses an address that is not host:port with a port from 1
// to 65535.
func CheckAddr(addr string) error {
	host, port, ok := SplitAddr(addr)
	if !ok || host == "" || strings.ContainsAny(addr, " ,\r\n") {
		return fmt.Errorf("%w: node address %q: want host:port", ErrBadTopology, addr)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("%w: node address %q: want a port from 1 to 65535", ErrBadTopology, addr)
	}
	return nil
}

// SplitAddr splits host:port, where host may be an IPv6 address in
// brackets (which are removed).
func SplitAddr(addr string) (host, port string, ok bool) {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return "", "", false
	}
	host, port = addr[:i], addr[i+1:]
	if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	} else if strings.Contains(host, ":") {
		return "", "", false
	}
	return host, port, true
}

// ParseRanges reads slot ranges: comma-separated slots or first-last
// ranges, or "-" for none. The result is sorted and merged.
func ParseRanges(s string) ([]Range, error) {
	if s == "-" {
		return nil, nil
	}
	var rs []Range
	for _, part := range strings.Split(s, ",") {
		a, b, isRange := strings.Cut(part, "-")
		if !isRange {
			b = a
		}
		first, err1 := parseSlot(a)
		last, err2 := parseSlot(b)
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("%w: slot range %q: %w", ErrBadTopology, part, err)
		}
		if first > last {
			return nil, fmt.Errorf("%w: slot range %q: first slot above the last", ErrBadTopology, part)
		}
		rs = append(rs, Range{first, last})
	}
	return Merge(rs), nil
}

func parseSlot(s string) (uint16, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n >= Slots {
		return 0, fmt.Errorf("slot %q: want 0 to %d", s, Slots-1)
	}
	return uint16(n), nil
}

// Merge sorts rs and joins ranges that overlap or touch.
func Merge(rs []Range) []Range {
	if len(rs) == 0 {
		return nil
	}
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b Range) int { return int(a.First) - int(b.First) })
	out := rs[:1]
	for _, r := range rs[1:] {
		last := &out[len(out)-1]
		if int(r.First) <= int(last.Last)+1 {
			last.Last = max(last.Last, r.Last)
			continue
		}
		out = append(out, r)
	}
	return out
}

// FormatRanges writes rs as ParseRanges reads them.
func FormatRanges(rs []Range) string {
	if len(rs) == 0 {
		return "-"
	}
	var b strings.Builder
	for i, r := range rs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(int(r.First)))
		if r.Last != r.First {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(int(r.Last)))
		}
	}
	return b.String()
}

// ExpandNodes reads --cluster-nodes: either the announced host:port of
// every node, comma-separated in ordinal order (size must then be 0 or at
// most their number: the nodes past size are known, for their own
// ordinals, but not in the initial topology), or a template containing
// {i}, which is replaced by each ordinal from 0 to size-1.
func ExpandNodes(list string, size int) ([]string, error) {
	var addrs []string
	if strings.Contains(list, "{i}") {
		if size < 1 {
			return nil, fmt.Errorf("%w: --cluster-nodes %q is a template ({i}): give the number of nodes with --cluster-size", ErrBadTopology, list)
		}
		for i := range size {
			addrs = append(addrs, Expand(list, i))
		}
	} else {
		for _, a := range strings.Split(list, ",") {
			addrs = append(addrs, strings.TrimSpace(a))
		}
		if size > len(addrs) {
			return nil, fmt.Errorf("%w: --cluster-size %d but --cluster-nodes lists only %d nodes", ErrBadTopology, size, len(addrs))
		}
	}
	for i, a := range addrs {
		if err := CheckAddr(a); err != nil {
			return nil, fmt.Errorf("--cluster-nodes, node %d: %w", i, err)
		}
		if slices.Index(addrs, a) != i {
			return nil, fmt.Errorf("%w: --cluster-nodes lists %s twice", ErrBadTopology, a)
		}
	}
	return addrs, nil
}

// Expand replaces {i} in template by ordinal.
func Expand(template string, ordinal int) string {
	return strings.ReplaceAll(template, "{i}", strconv.Itoa(ordinal))
}

// OrdinalFromHostname is the number after the last '-' of a StatefulSet
// pod's hostname: 2 for sluice-2.
func OrdinalFromHostname(host string) (int, error) {
	host, _, _ = strings.Cut(host, ".")
	i := strings.LastIndexByte(host, '-')
	d := host[i+1:]
	// Canonical decimal only, as a StatefulSet names its pods: not
	// sluice-+3 nor sluice-07.
	canonical := d != "" && strings.Trim(d, "0123456789") == "" && (d == "0" || d[0] != '0')
	n, err := strconv.Atoi(d)
	if i < 0 || !canonical || err != nil || n < 0 {
		return 0, fmt.Errorf("%w: hostname %q does not end in -N, a StatefulSet ordinal: give --cluster-ordinal", ErrBadTopology, host)
	}
	return n, nil
}

// Move is a hand-over of slots from one node to another, by address; From
// is "" for slots no node owns (a push alone gives them).
type Move struct {
	From, To string
	Slots    []Range
}

// Moved returns t with rs given to the node at addr (added when t lacks
// it), taken from whoever owned them, under the next epoch.
func (t Topology) Moved(rs []Range, addr string) Topology {
	var give [Slots]bool
	for _, r := range rs {
		for s := int(r.First); s <= int(r.Last); s++ {
			give[s] = true
		}
	}
	u := Topology{Epoch: t.Epoch + 1}
	found := false
	for _, n := range t.Nodes {
		m := Node{ID: n.ID, Addr: n.Addr}
		for _, r := range n.Slots {
			for s := int(r.First); s <= int(r.Last); s++ {
				if !give[s] {
					m.Slots = append(m.Slots, Range{uint16(s), uint16(s)})
				}
			}
		}
		if n.Addr == addr {
			found = true
			m.Slots = append(m.Slots, rs...)
		}
		m.Slots = Merge(m.Slots)
		u.Nodes = append(u.Nodes, m)
	}
	if !found {
		u.Nodes = append(u.Nodes, Node{ID: NodeID(addr), Addr: addr, Slots: Merge(rs)})
	}
	return u
}

// Without returns t without the nodes that own no slot and are not in
// keep, under the next epoch.
func (t Topology) Without(keep []string) Topology {
	u := Topology{Epoch: t.Epoch + 1}
	for _, n := range t.Nodes {
		if len(n.Slots) > 0 || slices.Contains(keep, n.Addr) {
			u.Nodes = append(u.Nodes, n)
		}
	}
	return u
}

// Rebalance plans the moves that spread the slots evenly over want, the
// nodes' addresses in ordinal order (node i of N gets ⌊16384·(i+1)/N⌋ −
// ⌊16384·i/N⌋ slots, as many as Initial gives it), moving as few slots as it
// can: nodes not in want give all theirs, the highest ordinals first (a
// scale-down), then unowned slots, then the nodes over their share give
// their highest slots; nodes under it take them in ordinal order.
func Rebalance(t Topology, want []string) []Move {
	m := len(want)
	if m == 0 {
		return nil
	}
	type give struct {
		from string
		slot uint16
	}
	var surplus []give
	owned := map[string][]uint16{}
	var unowned []uint16
	o := t.Owners()
	for s := range Slots {
		if o[s] == 0 {
			unowned = append(unowned, uint16(s))
			continue
		}
		a := t.Nodes[o[s]-1].Addr
		owned[a] = append(owned[a], uint16(s))
	}
	for i := len(t.Nodes) - 1; i >= 0; i-- {
		if a := t.Nodes[i].Addr; !slices.Contains(want, a) {
			for _, s := range owned[a] {
				surplus = append(surplus, give{a, s})
			}
		}
	}
	for _, s := range unowned {
		surplus = append(surplus, give{"", s})
	}
	// Initial's split, so that rebalancing a fresh cluster moves nothing
	// and 3 → 4 → 3 nodes ends with the 3-node counts.
	quota := func(i int) int { return Slots*(i+1)/m - Slots*i/m }
	for i, a := range want {
		if extra := len(owned[a]) - quota(i); extra > 0 {
			for _, s := range owned[a][len(owned[a])-extra:] {
				surplus = append(surplus, give{a, s})
			}
		}
	}
	var moves []Move
	for i, a := range want {
		need := quota(i) - len(owned[a])
		for need > 0 && len(surplus) > 0 {
			g := surplus[0]
			surplus = surplus[1:]
			need--
			if n := len(moves); n > 0 && moves[n-1].From == g.from && moves[n-1].To == a {
				moves[n-1].Slots = append(moves[n-1].Slots, Range{g.slot, g.slot})
				continue
			}
			moves = append(moves, Move{From: g.from, To: a, Slots: []Range{{g.slot, g.slot}}})
		}
	}
	for i := range moves {
		moves[i].Slots = Merge(moves[i].Slots)
	}
	return moves
}

// Claim is what one node's own topology says about itself: the slots that
// topology gives to the node's address, and its epoch. A node serves
// exactly the slots of its claim.
type Claim struct {
	Addr  string
	Epoch uint64
	Slots []Range
}

// ClaimOf is the claim of the node at addr whose topology is t.
func ClaimOf(t Topology, addr string) Claim {
	c := Claim{Addr: addr, Epoch: t.Epoch}
	if i := slices.IndexFunc(t.Nodes, func(n Node) bool { return n.Addr == addr }); i >= 0 {
		c.Slots = t.Nodes[i].Slots
	}
	return c
}

// Overlap is a slot range that two nodes both serve, each by its own
// topology: a limit there is counted on both.
type Overlap struct {
	A, B  Claim // the claims, A before B in the order given
	Slots []Range
}

// Overlaps finds the slots that two of the claims share: nodes that would
// both count a limit, as when a node started with a longer --cluster-nodes
// list than the running cluster's takes the initial topology of that list.
func Overlaps(claims []Claim) []Overlap {
	var owner [Slots]int16 // index in claims plus one
	var out []Overlap
	byPair := map[[2]int]int{}
	for i, c := range claims {
		for _, r := range c.Slots {
			for s := int(r.First); s <= int(r.Last); s++ {
				if j := int(owner[s]) - 1; j >= 0 && j != i {
					k, ok := byPair[[2]int{j, i}]
					if !ok {
						k = len(out)
						byPair[[2]int{j, i}] = k
						out = append(out, Overlap{A: claims[j], B: c})
					}
					out[k].Slots = append(out[k].Slots, Range{uint16(s), uint16(s)})
					continue
				}
				owner[s] = int16(i + 1)
			}
		}
	}
	for i := range out {
		out[i].Slots = Merge(out[i].Slots)
	}
	return out
}

// Shard is one replicated shard of a cluster with --cluster-replicas
// above 1: a range of slots and the nodes holding its replicas, by
// ordinal, the first its home (the node whose leadership keeps load
// spread).
type Shard struct {
	Slots    Range
	Replicas []int
}

// ErrReplicas refuses a replica count a cluster cannot place.
var ErrReplicas = errors.New("cluster: bad replica count")

// Place returns the shards of a cluster of n nodes with r replicas each,
// one shard per node: PlaceShards(n, n, r).
func Place(n, r int) ([]Shard, error) { return PlaceShards(n, n, r) }

// ErrShards refuses a shard count a cluster cannot place.
var ErrShards = errors.New("cluster: bad shard count")

// PlaceShards returns the s shards of a cluster of n nodes with r
// replicas each: shard i has slots ⌊16384·i/s⌋ to ⌊16384·(i+1)/s⌋−1
// (with s = n, those Initial gives ordinal i), and its replicas on
// ordinals i, i+1, …, i+r−1 modulo n, its home node i modulo n, so that
// each node is the home of s/n shards, give or take one, and holds r
// replicas per shard it is home to.
func PlaceShards(n, s, r int) ([]Shard, error) {
	if r != 1 && r != 3 && r != 5 {
		return nil, fmt.Errorf("%w: %d replicas; want 1, 3 or 5", ErrReplicas, r)
	}
	if n < r {
		return nil, fmt.Errorf("%w: %d replicas on %d nodes; want at least as many nodes as replicas", ErrReplicas, r, n)
	}
	if s < n || s > Slots {
		return nil, fmt.Errorf("%w: %d shards on %d nodes; want at least one per node, and at most %d", ErrShards, s, n, Slots)
	}
	shards := make([]Shard, s)
	for i := range shards {
		first, end := Slots*i/s, Slots*(i+1)/s
		shards[i].Slots = Range{uint16(first), uint16(end - 1)}
		for k := range r {
			shards[i].Replicas = append(shards[i].Replicas, (i+k)%n)
		}
	}
	return shards, nil
}
