package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/cluster"
)

// sluice cluster rebalance|move: online resharding, driven from outside
// the nodes. For each hand-over of slots the target drops its leftovers in
// them and starts importing them, the source starts noting the keys
// written in them, their records are copied page by page, then the keys
// changed meanwhile, then the source pauses the slots (clients get
// TRYAGAIN and retry), the last changes are copied, the target marks its
// copy complete for the next epoch, the topology with that epoch is pushed
// to the target, the source and every other node, and the source drops
// its copy. internal/clusternode/migrate.go has the nodes' side.

type clusterToolConfig struct {
	nodes    string
	size     int
	slots    string
	to       string
	passFile string
	pass     string
	timeout  time.Duration
	page     int
	topology string
	shard    int
	add      string
	addBus   string
	remove   string
	// moveTimeout bounds the wait for each shard's move in rebalance.
	moveTimeout time.Duration

	maxConfigFile byteSize

	// cacert, tlsCert and tlsKey make the tool connect over TLS, as
	// sluice backup does (clientTLS).
	cacert, tlsCert, tlsKey string
}

func newClusterFlagSet(cfg *clusterToolConfig, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("sluice cluster", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.nodes, "nodes", "", "sluice cluster: the nodes' announced host:port, comma-separated, or a template with {i} and --cluster-size; for rebalance, exactly the nodes that should own slots, in ordinal order")
	intVar(fs, &cfg.size, "cluster-size", 0, "sluice cluster: the number of nodes when --nodes is a template")
	fs.StringVar(&cfg.slots, "slots", "", "sluice cluster move: the slots to move, as 0-99,200")
	fs.StringVar(&cfg.to, "to", "", "sluice cluster move: the announced host:port of the node to move them to; sluice cluster place: the nodes to hold the shard, comma-separated, its home first")
	intVar(fs, &cfg.shard, "shard", -1, "sluice cluster place: the shard to move (CLUSTER PLACEMENT lists them)")
	fs.StringVar(&cfg.add, "add", "", "sluice cluster add-node: the announced host:port of the node to add")
	fs.StringVar(&cfg.remove, "remove", "", "sluice cluster remove-node: the announced host:port of the node to remove (it must hold no replica)")
	fs.StringVar(&cfg.addBus, "add-bus", "", "sluice cluster add-node: the host:port of the added node's replication listener (default: its port plus 10000)")
	fs.StringVar(&cfg.passFile, "requirepass-file", "", "file holding the password clients must give with AUTH (one line; a trailing newline is ignored)")
	fs.StringVar(&cfg.pass, "requirepass", "", "password clients must give with AUTH (visible in process listings: prefer --requirepass-file)")
	fs.StringVar(&cfg.cacert, "cacert", "", "sluice cluster: PEM CA file that signed the nodes' certificates: connect over TLS and verify them")
	fs.StringVar(&cfg.tlsCert, "tls-cert", "", "sluice cluster: PEM client certificate, for nodes with --tls-ca (with --tls-key); connects over TLS")
	fs.StringVar(&cfg.tlsKey, "tls-key", "", "sluice cluster: PEM private key of --tls-cert")
	durationVar(fs, &cfg.timeout, "cluster-command-timeout", 30*time.Second, "sluice cluster: the most one command to a node may take")
	durationVar(fs, &cfg.moveTimeout, "cluster-move-timeout", 10*time.Minute, "sluice cluster rebalance, --cluster-replicas above 1: the most it waits for one shard's move to finish (its new replicas caught up, its old ones let go)")
	fs.StringVar(&cfg.topology, "topology", "", "sluice cluster push: the topology to push, as CLUSTER TOPOLOGY prints it: <epoch> <host:port> <slots> ...")
	intVar(fs, &cfg.page, "cluster-page", 500, "sluice cluster: records copied per page while moving slots, and overrides listed per page by check-policy")
	addMaxConfigFile(fs, &cfg.maxConfigFile)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: sluice cluster rebalance --nodes a:p,b:p,c:p   (spread the slots evenly over exactly these nodes; --cluster-replicas above 1: the shards' replicas and homes)\n       sluice cluster move --nodes a:p,... --slots 0-99 --to d:p\n       sluice cluster show --nodes a:p,...   (the topology with the highest epoch, the nodes that have another, and any that answers as another node)\n       sluice cluster push --nodes a:p,... --topology '<epoch> a:p 0-8191 b:p 8192-16383'   (push a topology to every node: finishing an interrupted move)\n       sluice cluster renumber --nodes a:p,...   (push the highest topology under a low epoch: after the epoch cap)\n       sluice cluster place --nodes a:p,... --shard 0 --to a:p,b:p,d:p   (--cluster-replicas above 1: move a shard's replicas to these nodes, its home first)\n       sluice cluster add-node --nodes a:p,... --add d:p   (--cluster-replicas above 1: add a node, which holds no replica until place moves one there)\n       sluice cluster remove-node --nodes a:p,... --remove d:p   (--cluster-replicas above 1: remove a node whose replicas place moved away)\n       sluice cluster send --nodes a:p,... POLICY OVERRIDE <label> <actor> <limit>   (send a change of the dials or overrides to every node; fails naming each node that missed it)\n       sluice cluster check-policy --nodes a:p,...   (compare every node's dials and overrides; fails listing each difference)\n\n")
		fs.PrintDefaults()
	}
	return fs
}

// clusterCommand is sluice cluster: it changes or shows the topology of
// running nodes, by its own subcommand (rebalance, move, show, push,
// renumber, place, add-node, remove-node), or sends a change of the
// policy dials to every node and compares them (send, check-policy).
type clusterCommand struct{}

func (clusterCommand) run(inv invocation, args []string) error {
	ctx, lookupEnv, stdout, stderr := inv.ctx, inv.lookupEnv, inv.stdout, inv.stderr
	if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		newClusterFlagSet(&clusterToolConfig{}, stderr).Usage()
		return flag.ErrHelp
	}
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return errors.New("sluice cluster: want a subcommand: rebalance, move, show, push, renumber, place, add-node, remove-node, send or check-policy (see sluice cluster --help)")
	}
	sub := args[0]
	var cfg clusterToolConfig
	fs := newClusterFlagSet(&cfg, stderr)
	rest, err := parseArgsRest(fs, args[1:], lookupEnv)
	if err != nil {
		return err
	}
	if sub != "send" && len(rest) > 0 {
		return fmt.Errorf("unexpected argument %q: sluice cluster %s takes only flags (sluice cluster --help lists them)", rest[0], sub)
	}
	if sub == "send" {
		if err := checkSend(rest); err != nil {
			return err
		}
	}
	pass, err := readPassword(cfg.pass, cfg.passFile, cfg.maxConfigFile)
	if err != nil {
		return err
	}
	if cfg.nodes == "" {
		return errors.New("sluice cluster: --nodes: want the nodes' host:port, comma-separated")
	}
	nodes, err := cluster.ExpandNodes(cfg.nodes, cfg.size)
	if err != nil {
		return err
	}
	if cfg.page < 1 || cfg.page > 500 {
		// RESTORE takes a page's pairs in one command, under --max-args.
		return fmt.Errorf("--cluster-page %d: want 1 to 500 (RESTORE sends a page's key-value pairs in one command, under the nodes' --max-args 1024)", cfg.page)
	}
	if (cfg.tlsCert == "") != (cfg.tlsKey == "") {
		return errors.New("--tls-cert and --tls-key: give both or neither")
	}
	ct := &clusterTool{pass: pass, timeout: cfg.timeout, page: cfg.page, out: stdout, clients: map[string]*redis.Client{}}
	if cfg.cacert != "" || cfg.tlsCert != "" {
		if ct.tls, err = clientTLS(cfg.cacert, cfg.tlsCert, cfg.tlsKey, cfg.maxConfigFile); err != nil {
			return err
		}
	}
	defer ct.close()
	t, err := ct.topology(ctx, nodes)
	if err != nil {
		return err
	}
	if len(ct.impostors) > 0 {
		if sub == "show" {
			fmt.Fprintln(stdout, strings.Join(t.Args(), " "))
		}
		for _, line := range ct.impostors {
			fmt.Fprintln(stdout, line)
		}
		return fmt.Errorf("%d node(s) answer as another node (their lines above): each serves the other node's slots from its own records and redirects its own slots to itself; "+
			"stop it and start it with its own --cluster-ordinal on its own data directory, then run sluice cluster %s again", len(ct.impostors), sub)
	}
	// Replicated shards: the placement group agrees on the nodes of each
	// shard, and each node's slot table follows the shards' leaders under
	// epochs of its own, so only the placement is compared.
	if places, missing := ct.placements(ctx); len(places) > 0 {
		switch sub {
		case "show":
			return ct.showPlacement(places, missing)
		case "place", "add-node", "remove-node", "send", "check-policy":
		case "rebalance":
			return ct.rebalanceReplicas(ctx, ct.highestPlacement(places), nodes, cfg.moveTimeout)
		default:
			return fmt.Errorf("sluice cluster %s: these nodes run replicated shards (--cluster-replicas above 1), whose slot ranges are fixed: move a shard's replicas with sluice cluster place or rebalance", sub)
		}
	}
	// Two nodes serving one slot count its limits twice: show says so and
	// fails; a move or rebalance planned from one of their topologies would
	// leave the other serving, so they refuse until a push settles it.
	if ov := cluster.Overlaps(ct.claims); len(ov) > 0 {
		if sub == "show" {
			fmt.Fprintln(stdout, strings.Join(t.Args(), " "))
		}
		if sub == "show" || sub == "move" || sub == "rebalance" {
			for _, o := range ov {
				fmt.Fprintf(stdout, "slots %s: served by both %s (epoch %d) and %s (epoch %d)\n",
					cluster.FormatRanges(o.Slots), o.A.Addr, o.A.Epoch, o.B.Addr, o.B.Epoch)
			}
			fix := t
			fix.Epoch++
			return fmt.Errorf("%d pair(s) of nodes serve the same slots (their lines above), so limits there are counted twice: give every node one topology with "+
				"sluice cluster push --nodes %s --topology '%s' (the highest topology under a new epoch; a node it does not give slots to redirects them), then add nodes with sluice cluster rebalance",
				len(ov), strings.Join(ct.order, ","), strings.Join(fix.Args(), " "))
		}
	}
	switch sub {
	case "show":
		fmt.Fprintln(stdout, strings.Join(t.Args(), " "))
		// Nodes with another topology: an interrupted move (a source
		// that restarted before taking the new epoch serves its old slots).
		var behind []string
		for _, addr := range ct.order {
			if e := ct.epochs[addr]; e != t.Epoch {
				fmt.Fprintf(stdout, "node %s: epoch %d, not %d\n", addr, e, t.Epoch)
				behind = append(behind, addr)
			}
		}
		if len(behind) > 0 {
			return fmt.Errorf("nodes %s have another topology than epoch %d: if a move was interrupted, push the highest one to every node: sluice cluster push --nodes %s --topology '%s'",
				strings.Join(behind, ","), t.Epoch, strings.Join(behind, ","), strings.Join(t.Args(), " "))
		}
		return nil
	case "push":
		pt, err := cluster.Parse(strings.Fields(cfg.topology))
		if err != nil {
			return fmt.Errorf("--topology %q: %w", cfg.topology, err)
		}
		return ct.pushAll(ctx, pt, t, nodes)
	case "renumber":
		// The highest epoch below the cap, plus one: the nodes stuck at the
		// cap take any epoch, the others a higher one.
		var low uint64
		for _, e := range ct.epochs {
			if e < cluster.MaxEpoch {
				low = max(low, e)
			}
		}
		rt := t
		rt.Epoch = low + 1
		if err := ct.pushAll(ctx, rt, t, nodes); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "renumbered: epoch %d: %s\n", rt.Epoch, strings.Join(rt.Args()[1:], " "))
		return nil
	case "move":
		rs, err := cluster.ParseRanges(cfg.slots)
		if err != nil || len(rs) == 0 {
			return fmt.Errorf("--slots %q: want slots like 0-99,200: %v", cfg.slots, err)
		}
		if err := cluster.CheckAddr(cfg.to); err != nil {
			return fmt.Errorf("--to: %w", err)
		}
		if t.Epoch >= cluster.MaxEpoch {
			return cluster.ErrEpochCap
		}
		o := t.Owners()
		bySource := map[string][]cluster.Range{}
		var sources []string
		for _, r := range rs {
			for s := int(r.First); s <= int(r.Last); s++ {
				from := ""
				if o[s] != 0 {
					from = t.Nodes[o[s]-1].Addr
				}
				if from == cfg.to {
					continue
				}
				if _, ok := bySource[from]; !ok {
					sources = append(sources, from)
				}
				bySource[from] = append(bySource[from], cluster.Range{First: uint16(s), Last: uint16(s)})
			}
		}
		for _, from := range sources {
			if t, err = ct.move(ctx, t, cluster.Move{From: from, To: cfg.to, Slots: cluster.Merge(bySource[from])}); err != nil {
				return err
			}
		}
		return nil
	case "place":
		if cfg.shard < 0 || cfg.to == "" {
			return errors.New("sluice cluster place: want --shard, the shard to move, and --to, the nodes to hold it, comma-separated, its home first")
		}
		args := []any{"CLUSTER", "PLACE", cfg.shard}
		for _, a := range strings.Split(cfg.to, ",") {
			args = append(args, a)
		}
		return ct.place(ctx, nodes, args)
	case "add-node":
		if cfg.add == "" {
			return errors.New("sluice cluster add-node: want --add, the announced host:port of the node to add")
		}
		args := []any{"CLUSTER", "ADDNODE", cfg.add}
		if cfg.addBus != "" {
			args = append(args, cfg.addBus)
		}
		return ct.place(ctx, nodes, args)
	case "remove-node":
		if cfg.remove == "" {
			return errors.New("sluice cluster remove-node: want --remove, the announced host:port of the node to remove")
		}
		return ct.place(ctx, nodes, []any{"CLUSTER", "REMOVENODE", cfg.remove})
	case "send":
		return ct.send(ctx, addrsOf(t), rest)
	case "check-policy":
		return ct.checkPolicy(ctx, addrsOf(t))
	case "rebalance":
		if t.Epoch >= cluster.MaxEpoch {
			return cluster.ErrEpochCap
		}
		for _, mv := range cluster.Rebalance(t, nodes) {
			if t, err = ct.move(ctx, t, mv); err != nil {
				return err
			}
		}
		if u := t.Without(nodes); len(u.Nodes) != len(t.Nodes) {
			if err := ct.push(ctx, u, t, nil); err != nil {
				return err
			}
			t = u
		}
		fmt.Fprintf(stdout, "balanced: epoch %d: %s\n", t.Epoch, strings.Join(t.Args()[1:], " "))
		return nil
	}
	return fmt.Errorf("sluice cluster %s: unknown subcommand; want rebalance, move, show, push, renumber, place, add-node, remove-node, send or check-policy", sub)
}

// placements asks each node that answered CLUSTER TOPOLOGY for its
// CLUSTER PLACEMENT, which only the nodes of a replicated cluster
// answer: the answers by node, without the placement group's leader line
// (nodes learn of a new leader at different times), and the nodes that
// did not answer.
func (ct *clusterTool) placements(ctx context.Context) (map[string]string, []string) {
	places := map[string]string{}
	var missing []string
	for _, addr := range ct.order {
		v, err := ct.do(ctx, addr, "CLUSTER", "PLACEMENT")
		if err != nil {
			missing = append(missing, addr)
			continue
		}
		text, _ := v.(string)
		var keep []string
		for _, line := range strings.Split(text, "\n") {
			if !strings.HasPrefix(line, "leader ") {
				keep = append(keep, line)
			}
		}
		places[addr] = strings.Join(keep, "\n")
	}
	return places, missing
}

// placementEpoch is the epoch of a CLUSTER PLACEMENT text.
func placementEpoch(text string) uint64 {
	var e uint64
	fmt.Sscanf(text, "epoch %d", &e)
	return e
}

// highestPlacement is the placement of the highest epoch among places,
// the first node's on a tie.
func (ct *clusterTool) highestPlacement(places map[string]string) string {
	best := ""
	for _, addr := range ct.order {
		if p, ok := places[addr]; ok && (best == "" || placementEpoch(p) > placementEpoch(best)) {
			best = p
		}
	}
	return best
}

// showPlacement prints the placement of the highest epoch the nodes
// follow, then each node that follows another, or did not answer, and
// fails if there is one.
func (ct *clusterTool) showPlacement(places map[string]string, missing []string) error {
	epochOf := placementEpoch
	best := ct.highestPlacement(places)
	fmt.Fprint(ct.out, best)
	var behind []string
	for _, addr := range ct.order {
		p, ok := places[addr]
		switch {
		case !ok:
		case epochOf(p) != epochOf(best):
			fmt.Fprintf(ct.out, "node %s: placement epoch %d, not %d\n", addr, epochOf(p), epochOf(best))
			behind = append(behind, addr)
		case p != best:
			fmt.Fprintf(ct.out, "node %s: another placement at epoch %d\n", addr, epochOf(p))
			behind = append(behind, addr)
		}
	}
	for _, addr := range missing {
		fmt.Fprintf(ct.out, "node %s: no placement (its replicas have not started)\n", addr)
		behind = append(behind, addr)
	}
	if len(behind) > 0 {
		return fmt.Errorf("nodes %s do not follow the placement of epoch %d: a node that was away follows the placement group's moves once it is back and has heard from it; if one stays behind, see its log", strings.Join(behind, ","), epochOf(best))
	}
	return nil
}

// leaderHint is what a node that does not lead the placement says before
// the leader's address (internal/clusternode).
const leaderHint = " to its leader, "

// place changes the placement by args (CLUSTER PLACE, ADDNODE or
// REMOVENODE) on the placement's leader (propose), then prints the
// placement.
func (ct *clusterTool) place(ctx context.Context, nodes []string, args []any) error {
	epoch, err := ct.propose(ctx, nodes, args)
	if err != nil {
		return err
	}
	text, err := ct.do(ctx, ct.placedOn, "CLUSTER", "PLACEMENT")
	if err != nil {
		return err
	}
	verb := map[any]string{"PLACE": "placed", "ADDNODE": "added", "REMOVENODE": "removed"}[args[1]]
	fmt.Fprintf(ct.out, "%s: epoch %v\n%v", verb, epoch, text)
	return nil
}

// propose sends args, a change of the placement, to the placement
// group's leader, found by asking the nodes (one that does not lead names
// the leader; during an election it asks again), and returns the new
// epoch; placedOn is then the leader that took it.
func (ct *clusterTool) propose(ctx context.Context, nodes []string, args []any) (any, error) {
	queue := slices.Clone(nodes)
	var errs []error
	deadline := time.Now().Add(ct.timeout)
	for len(queue) > 0 {
		addr := queue[0]
		queue = queue[1:]
		v, err := ct.do(ctx, addr, args...)
		if err == nil {
			ct.placedOn = addr
			return v, nil
		}
		msg := err.Error()
		switch {
		case strings.Contains(msg, leaderHint):
			queue = append([]string{strings.TrimSpace(msg[strings.Index(msg, leaderHint)+len(leaderHint):])}, queue...)
		case strings.Contains(msg, "TRYAGAIN") && time.Now().Before(deadline):
			queue = append(queue, addr) // an election: ask again
			time.Sleep(100 * time.Millisecond)
		case strings.Contains(msg, "ERR "):
			return nil, err // a change the leader refuses
		}
		errs = append(errs, err)
		if len(errs) > 4*len(nodes) {
			break
		}
	}
	return nil, fmt.Errorf("sluice cluster: no node took CLUSTER %v: %w", args[1], errors.Join(errs...))
}

// clusterTool talks to the nodes, one client each.
type clusterTool struct {
	pass    string
	timeout time.Duration
	page    int
	out     io.Writer
	clients map[string]*redis.Client
	// epochs is each answering node's epoch, in order, as topology found
	// them.
	epochs map[string]uint64
	order  []string
	// claims are the slots each answering node serves by its own
	// topology, in order, as topology found them.
	claims []cluster.Claim
	// impostors are the lines naming each node of a topology whose
	// CLUSTER MYID is not its address's ID, as topology found them.
	impostors []string
	// placedOn is the node that took the last change of the placement
	// (propose).
	placedOn string
	// tls, when set, is how the tool connects to every node.
	tls *tls.Config
}

func (ct *clusterTool) client(addr string) *redis.Client {
	c := ct.clients[addr]
	if c == nil {
		c = redis.NewClient(&redis.Options{Addr: addr, Password: ct.pass, MaxRetries: -1, PoolSize: 4,
			DialTimeout: ct.timeout, ReadTimeout: ct.timeout, WriteTimeout: ct.timeout, Protocol: 2, TLSConfig: ct.tls})
		ct.clients[addr] = c
	}
	return c
}

func (ct *clusterTool) close() {
	for _, c := range ct.clients {
		c.Close()
	}
}

// do runs one command on addr, naming the node and command in its error.
func (ct *clusterTool) do(ctx context.Context, addr string, args ...any) (any, error) {
	v, err := ct.client(addr).Do(ctx, args...).Result()
	if err != nil {
		name := fmt.Sprint(args[0])
		if len(args) > 1 {
			name += " " + fmt.Sprint(args[1])
		}
		return nil, fmt.Errorf("node %s: %s: %w", addr, name, err)
	}
	return v, nil
}

// topology asks every node given, and every node their topologies name,
// for its topology, and returns the one with the highest epoch.
func (ct *clusterTool) topology(ctx context.Context, nodes []string) (cluster.Topology, error) {
	var best cluster.Topology
	var tops []cluster.Topology
	found := false
	asked, named := map[string]bool{}, map[string]bool{}
	queue := slices.Clone(nodes)
	var errs []error
	for len(queue) > 0 {
		addr := queue[0]
		queue = queue[1:]
		if asked[addr] {
			continue
		}
		asked[addr] = true
		v, err := ct.do(ctx, addr, "CLUSTER", "TOPOLOGY")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s, _ := v.(string)
		t, err := cluster.Decode([]byte("v1 " + s)) // an epoch past the cap too, for renumber
		if err != nil {
			return best, fmt.Errorf("node %s: CLUSTER TOPOLOGY: %w", addr, err)
		}
		if ct.epochs == nil {
			ct.epochs = map[string]uint64{}
		}
		ct.epochs[addr] = t.Epoch
		ct.order = append(ct.order, addr)
		ct.claims = append(ct.claims, cluster.ClaimOf(t, addr))
		for _, n := range t.Nodes {
			queue = append(queue, n.Addr)
			named[n.Addr] = true
		}
		tops = append(tops, t)
		if !found || t.Epoch > best.Epoch {
			best, found = t, true
		}
	}
	if !found {
		return best, fmt.Errorf("no node answered CLUSTER TOPOLOGY: %w", errors.Join(errs...))
	}
	// Of different topologies under the highest epoch (nodes started with
	// different --cluster-nodes lists), the one most nodes have.
	most := 0
	for _, u := range tops {
		if u.Epoch != best.Epoch {
			continue
		}
		n := 0
		for _, v := range tops {
			if u.Equal(v) {
				n++
			}
		}
		if n > most {
			best, most = u, n
		}
	}
	return best, ct.checkIDs(ctx, named)
}

// checkIDs asks every answering node some topology names (its announced
// address) for CLUSTER MYID, and notes in impostors each that answers
// another ID than its address's: a node started with another node's
// ordinal takes that node's ID. Addresses only given in --nodes may be
// aliases, and are not checked.
func (ct *clusterTool) checkIDs(ctx context.Context, named map[string]bool) error {
	byID := map[string]string{}
	for addr := range named {
		byID[cluster.NodeID(addr)] = addr
	}
	for _, addr := range ct.order {
		if !named[addr] {
			continue
		}
		v, err := ct.do(ctx, addr, "CLUSTER", "MYID")
		if err != nil {
			return err
		}
		id, _ := v.(string)
		if want := cluster.NodeID(addr); id != want {
			as := byID[id]
			if as == "" {
				as = "a node no topology names"
			}
			ct.impostors = append(ct.impostors, fmt.Sprintf("node %s: answers as %s (CLUSTER MYID %s, not %s): it was started with another node's --cluster-ordinal or --cluster-nodes", addr, as, id, want))
		}
	}
	return nil
}

// push gives t to the nodes in first, in order (an error there stops it),
// then to every other node of t and of old (an error there is reported and
// skipped: such a node redirects through the others until it gets a later
// topology, e.g. when it restarts and reads its own).
func (ct *clusterTool) push(ctx context.Context, t, old cluster.Topology, first []string) error {
	args := []any{"CLUSTER", "SETTOPOLOGY"}
	for _, a := range t.Args() {
		args = append(args, a)
	}
	done := map[string]bool{}
	for _, addr := range first {
		if _, err := ct.do(ctx, addr, args...); err != nil {
			return err
		}
		done[addr] = true
	}
	for _, n := range append(slices.Clone(t.Nodes), old.Nodes...) {
		if done[n.Addr] {
			continue
		}
		done[n.Addr] = true
		if _, err := ct.do(ctx, n.Addr, args...); err != nil {
			fmt.Fprintf(ct.out, "warning: %v; it redirects through the others until it gets epoch %d or later\n", err, t.Epoch)
		}
	}
	return nil
}

// move hands mv's slots over, with their records, and returns the new
// topology. On an error before the push, the source serves the slots
// again and the target's partial copy is dropped; the error says what
// failed and where each node is left.
func (ct *clusterTool) move(ctx context.Context, t cluster.Topology, mv cluster.Move) (cluster.Topology, error) {
	ranges := cluster.FormatRanges(mv.Slots)
	nt := t.Moved(mv.Slots, mv.To)
	if mv.From == "" {
		if err := ct.push(ctx, nt, t, []string{mv.To}); err != nil {
			return t, err
		}
		fmt.Fprintf(ct.out, "gave unowned slots %s to %s (epoch %d)\n", ranges, mv.To, nt.Epoch)
		return nt, nil
	}
	start := time.Now()
	if _, err := ct.do(ctx, mv.To, "CLUSTER", "IMPORT", "START", ranges); err != nil {
		return t, fmt.Errorf("moving slots %s from %s to %s: %w; nothing was copied: the source serves them as before", ranges, mv.From, mv.To, err)
	}
	if _, err := ct.do(ctx, mv.From, "CLUSTER", "MIGRATE", "START", ranges); err != nil {
		// Not cancelled: START refuses while another move is under way
		// off the source, and CANCEL would end that one.
		return t, ct.undo(ctx, mv, ranges, err, importing)
	}
	n, err := ct.copySlots(ctx, mv)
	if err == nil {
		_, err = ct.do(ctx, mv.From, "CLUSTER", "MIGRATE", "PAUSE")
	}
	var last int
	if err == nil {
		last, err = ct.copyDirty(ctx, mv, true)
	}
	stage := copying
	if err == nil {
		// Synced on the target, and takeable only at nt's epoch: a
		// partial copy never becomes the target's.
		_, err = ct.do(ctx, mv.To, "CLUSTER", "IMPORT", "DONE", ranges, nt.Epoch)
		stage = copied // or may be, when the reply was lost
	}
	if err == nil {
		err = ct.pushTarget(ctx, t, nt, mv.To)
		var owned errTargetMayOwn
		if errors.As(err, &owned) {
			// The target may serve the slots at the new epoch: resuming
			// the source would have both count the same buckets.
			return t, fmt.Errorf("moving slots %s from %s to %s: %w; the source keeps them paused (clients get TRYAGAIN) and must NOT be cancelled; the target holds a complete, synced copy that only epoch %d's topology gives it: "+
				"see which epoch each node has with `sluice cluster show --nodes %s`, then push the topology with `sluice cluster push --nodes %s --topology '%s'`, then drop the source's copy with `redis-cli -h %s -p %s CLUSTER DROP %s`",
				ranges, mv.From, mv.To, err, nt.Epoch, mv.From, mv.To, strings.Join(nt.Args(), " "), hostOf(mv.From), portOf(mv.From), ranges)
		}
	}
	if err != nil {
		return t, ct.undo(ctx, mv, ranges, err, stage)
	}
	// The target owns the slots from now on: the source is never resumed,
	// it stays paused (TRYAGAIN) until it takes the topology.
	if err := ct.pushRetrying(ctx, nt, mv.From); err != nil {
		return nt, fmt.Errorf("moved slots %s to %s (epoch %d), but the source %s did not take the new topology: %w; it keeps them paused (clients get TRYAGAIN) and must NOT be cancelled: "+
			"push the topology to it, and to every node, with `sluice cluster push --nodes %s --topology '%s'`, then drop its copy with `redis-cli -h %s -p %s CLUSTER DROP %s`",
			ranges, mv.To, nt.Epoch, mv.From, err, mv.From, strings.Join(nt.Args(), " "), hostOf(mv.From), portOf(mv.From), ranges)
	}
	_ = ct.push(ctx, nt, t, nil) // every node, the two above again (the same topology is accepted): an error there is a warning
	moved := fmt.Sprintf("moved slots %s from %s to %s: %d records written to the target before the pause, %d after it, epoch %d, %v",
		ranges, mv.From, mv.To, n, last, nt.Epoch, time.Since(start).Round(time.Millisecond))
	dropped, err := ct.do(ctx, mv.From, "CLUSTER", "DROP", ranges)
	if err != nil {
		fmt.Fprintf(ct.out, "%s; but the source's copy was not dropped: %v; the target serves the slots, the source answers MOVED for them and keeps a stale copy it never serves: drop it with `redis-cli -h %s -p %s CLUSTER DROP %s`\n",
			moved, err, hostOf(mv.From), portOf(mv.From), ranges)
		return nt, nil
	}
	fmt.Fprintf(ct.out, "%s, %d records dropped on the source\n", moved, dropped)
	return nt, nil
}

// How far a move got, for undo.
type moveStage int

const (
	importing moveStage = iota // the target took IMPORT START
	copying                    // and the source MIGRATE START
	copied                     // and the target may have taken IMPORT DONE
)

// undo ends a move that failed (cause) at stage, before the target could
// own the slots: the source serves them again and the target drops its
// partial copy. The error says what failed and where each node is left.
func (ct *clusterTool) undo(ctx context.Context, mv cluster.Move, ranges string, cause error, stage moveStage) error {
	src := "the source " + mv.From + " serves them again"
	if stage == importing {
		src = "the source " + mv.From + " serves them as before"
	} else if _, err := ct.do(ctx, mv.From, "CLUSTER", "MIGRATE", "CANCEL"); err != nil {
		src = fmt.Sprintf("the source %s still owns them, but could not be told to serve them again (%v): if it had paused them, its clients get TRYAGAIN until it restarts or gets `redis-cli -h %s -p %s CLUSTER MIGRATE CANCEL`",
			mv.From, err, hostOf(mv.From), portOf(mv.From))
	}
	dst := "the target " + mv.To + " dropped what it had copied"
	if _, err := ct.do(ctx, mv.To, "CLUSTER", "DROP", ranges); err != nil {
		also := "the next move of these slots drops it too"
		if stage < copied {
			also = "a restart drops it too, as does the next move of these slots"
		}
		dst = fmt.Sprintf("the target %s could not drop its partial copy (%v): it does not serve it; drop it with `redis-cli -h %s -p %s CLUSTER DROP %s` once it answers (%s)",
			mv.To, err, hostOf(mv.To), portOf(mv.To), ranges, also)
	}
	return fmt.Errorf("moving slots %s from %s to %s failed: %w; %s; %s; run the move again", ranges, mv.From, mv.To, cause, src, dst)
}

// pushAll gives t to the nodes given, then to every node of t and of old,
// reporting every node that refused it.
func (ct *clusterTool) pushAll(ctx context.Context, t, old cluster.Topology, nodes []string) error {
	var errs []error
	done := map[string]bool{}
	for _, n := range append(append(slices.Clone(nodes), addrsOf(t)...), addrsOf(old)...) {
		if done[n] {
			continue
		}
		done[n] = true
		if err := ct.pushOne(ctx, t, n); err != nil {
			errs = append(errs, err)
			continue
		}
		fmt.Fprintf(ct.out, "node %s: epoch %d\n", n, t.Epoch)
	}
	return errors.Join(errs...)
}

func addrsOf(t cluster.Topology) []string {
	a := make([]string, len(t.Nodes))
	for i, n := range t.Nodes {
		a[i] = n.Addr
	}
	return a
}

// errTargetMayOwn is pushTarget's error when the target may have taken the
// new topology: the move can be neither finished nor undone by the tool.
type errTargetMayOwn struct{ err error }

func (e errTargetMayOwn) Error() string { return e.err.Error() }
func (e errTargetMayOwn) Unwrap() error { return e.err }

// pushTarget gives nt to the target, the first node to have it. When the
// push fails (a reset, a timeout: the target may have taken it or may take
// it still), the target is fenced: the old assignment is pushed to it
// under nt's epoch. If it takes that, it can never take nt (same epoch),
// and the source may serve the slots again: pushTarget returns an error
// the caller undoes the move after. If it refuses it (it took nt) or
// cannot be reached, the error is an errTargetMayOwn: the source must stay
// paused.
func (ct *clusterTool) pushTarget(ctx context.Context, t, nt cluster.Topology, to string) error {
	err := ct.pushOne(ctx, nt, to)
	if err == nil {
		return nil
	}
	fence := t
	fence.Epoch = nt.Epoch
	if ferr := ct.pushOne(ctx, fence, to); ferr != nil {
		if cur, terr := ct.topologyOf(ctx, to); terr == nil && cur.Equal(nt) {
			return nil // it took nt: the reply was lost
		}
		return errTargetMayOwn{fmt.Errorf("%w; and fencing it with the old assignment at epoch %d failed: %v", err, nt.Epoch, ferr)}
	}
	return fmt.Errorf("%w (the target was fenced: it holds the old assignment at epoch %d)", err, nt.Epoch)
}

// pushOne gives t to the node at addr.
func (ct *clusterTool) pushOne(ctx context.Context, t cluster.Topology, addr string) error {
	args := []any{"CLUSTER", "SETTOPOLOGY"}
	for _, a := range t.Args() {
		args = append(args, a)
	}
	_, err := ct.do(ctx, addr, args...)
	return err
}

// pushRetries bounds pushRetrying: about 10 s of waits between attempts,
// each attempt bounded by --cluster-command-timeout.
const pushRetries = 8

// pushRetrying gives t to addr, retrying with growing waits: once the
// target took t, the source must take it too, however long it is away.
func (ct *clusterTool) pushRetrying(ctx context.Context, t cluster.Topology, addr string) error {
	wait := 100 * time.Millisecond
	var err error
	for i := 0; i < pushRetries; i++ {
		if err = ct.pushOne(ctx, t, addr); err == nil {
			return nil
		}
		if cur, terr := ct.topologyOf(ctx, addr); terr == nil && cur.Epoch >= t.Epoch {
			return nil // it has t (the reply was lost) or a later one
		}
		fmt.Fprintf(ct.out, "warning: %v; retrying in %v\n", err, wait)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
	return err
}

// topologyOf is addr's topology.
func (ct *clusterTool) topologyOf(ctx context.Context, addr string) (cluster.Topology, error) {
	v, err := ct.do(ctx, addr, "CLUSTER", "TOPOLOGY")
	if err != nil {
		return cluster.Topology{}, err
	}
	s, _ := v.(string)
	t, err := cluster.Parse(strings.Fields(s))
	if err != nil {
		return t, fmt.Errorf("node %s: CLUSTER TOPOLOGY: %w", addr, err)
	}
	return t, nil
}

func hostOf(addr string) string { h, _, _ := cluster.SplitAddr(addr); return h }
func portOf(addr string) string { _, p, _ := cluster.SplitAddr(addr); return p }

// copySlots copies the records of mv's slots page by page, then the keys
// changed meanwhile until few change per round; it returns how many
// records it wrote.
func (ct *clusterTool) copySlots(ctx context.Context, mv cluster.Move) (int, error) {
	total := 0
	for _, r := range mv.Slots {
		cursor := ""
		for {
			v, err := ct.do(ctx, mv.From, "CLUSTER", "DUMP", int(r.First), int(r.Last), cursor, ct.page)
			if err != nil {
				return total, err
			}
			a, _ := v.([]any)
			if len(a) == 0 {
				return total, fmt.Errorf("node %s: CLUSTER DUMP: empty reply", mv.From)
			}
			if err := ct.restore(ctx, mv.To, a[1:]); err != nil {
				return total, err
			}
			total += len(a[1:]) / 2
			cursor, _ = a[0].(string)
			if cursor == "" {
				break
			}
		}
	}
	n, err := ct.copyDirty(ctx, mv, false)
	return total + n, err
}

// copyDirty copies the keys the source noted as changed: until a round
// returns less than a page (all false), or until none is left (all true).
func (ct *clusterTool) copyDirty(ctx context.Context, mv cluster.Move, all bool) (int, error) {
	total := 0
	for round := 0; ; round++ {
		v, err := ct.do(ctx, mv.From, "CLUSTER", "MIGRATE", "DIRTY", ct.page)
		if err != nil {
			return total, err
		}
		a, _ := v.([]any)
		if err := ct.restore(ctx, mv.To, a); err != nil {
			return total, err
		}
		total += len(a) / 2
		if len(a) == 0 || (!all && (len(a)/2 < ct.page || round >= 50)) {
			return total, nil
		}
	}
}

// restore writes key-value pairs to addr with CLUSTER RESTORE.
func (ct *clusterTool) restore(ctx context.Context, addr string, pairs []any) error {
	if len(pairs) == 0 {
		return nil
	}
	args := append([]any{"CLUSTER", "RESTORE"}, pairs...)
	v, err := ct.do(ctx, addr, args...)
	if err != nil {
		return err
	}
	if n, _ := v.(int64); n != int64(len(pairs)/2) {
		return fmt.Errorf("node %s: CLUSTER RESTORE wrote %v records of %d", addr, v, len(pairs)/2)
	}
	return nil
}
