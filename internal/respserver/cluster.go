package respserver

import (
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/clusternode"
	"github.com/sluicehq/sluice/internal/cmddoc"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/keyspace"
)

// Cluster mode's RESP side: package clusternode is the node (its
// topology, slot moves, forwarded counters); here every keyed command is
// checked once, in exec, against its slot table (routeKeys), and the
// CLUSTER, ASKING and SLUICE.COUNTERHIT commands are handed to it.

var (
	errClusterDisabled      = resp.Error("ERR This instance has cluster support disabled")
	errCrossSlot            = resp.Error("CROSSSLOT Keys in request don't hash to the same slot")
	errCounterHitStandalone = resp.Error("ERR SLUICE.COUNTERHIT is sent between the nodes of a cluster; this node is standalone (no --cluster-nodes)")
)

// routeKeys checks, in cluster mode, that a keyed command's keys (at the
// command table's first, last and step positions) share one slot and that
// this node owns it; otherwise it answers CROSSSLOT, CLUSTERDOWN or MOVED
// and returns false. It allocates nothing.
func (s *Server) routeKeys(c *client, cmd *command, args [][]byte) bool {
	last := cmd.Last
	if last < 0 {
		last += len(args)
	}
	slot := keyspace.Slot(args[cmd.First])
	for i := cmd.First + cmd.Step; i <= last && i < len(args); i += cmd.Step {
		if keyspace.Slot(args[i]) != slot {
			s.replyErr(c, errCrossSlot)
			return false
		}
	}
	return s.routeSlot(c, slot)
}

// routeSlot is routeKeys' check of one slot: it answers CLUSTERDOWN,
// TRYAGAIN or MOVED and returns false unless this node serves slot.
func (s *Server) routeSlot(c *client, slot uint16) bool {
	moved, err := s.clus.Route(slot)
	switch {
	case err != nil:
		s.replyErr(c, err)
		return false
	case moved != "":
		c.Out = append(c.Out, "-MOVED "...)
		c.Out = strconv.AppendUint(c.Out, uint64(slot), 10)
		c.Out = append(c.Out, ' ')
		c.Out = append(c.Out, moved...)
		c.Out = append(c.Out, '\r', '\n')
		return false
	}
	return true
}

// helloMode is HELLO's mode and INFO's redis_mode.
func (s *Server) helloMode() string {
	if s.clus != nil {
		return "cluster"
	}
	return "standalone"
}

func (s *Server) writeClusterInfo(b *strings.Builder) {
	b.WriteString("# Cluster\r\ncluster_enabled:")
	if s.clus != nil {
		b.WriteString("1\r\n")
	} else {
		b.WriteString("0\r\n")
	}
}

// cmdAsking, cmdReadonly and cmdReadwrite accept what cluster clients send.
// Slots move with a write pause rather than ASK redirections, and no
// replica serves reads (a follower of a replicated shard redirects every
// keyed command to its leader), so they change nothing.
func cmdAsking(s *Server, c *client, args [][]byte) {
	if s.clus == nil {
		s.replyErr(c, errClusterDisabled)
		return
	}
	c.Out = resp.AppendSimple(c.Out, "OK")
}

func cmdCluster(s *Server, c *client, args [][]byte) {
	if strings.EqualFold(string(args[1]), "help") {
		c.Out = appendHelp(c.Out, clusternode.Help)
		return
	}
	if s.clus == nil {
		s.replyErr(c, errClusterDisabled)
		return
	}
	if err := s.clus.Command(&c.Ctx, args, clusterCaller{s, c}); err != nil {
		s.replyErr(c, err)
	}
}

// clusterCaller is the connection a CLUSTER subcommand came on
// (clusternode.Caller).
type clusterCaller struct {
	s *Server
	c *client
}

func (cc clusterCaller) Commit() error { return cc.s.commitWrites(cc.c) }

func (cc clusterCaller) RESP3() bool { return cc.c.resp == 3 }

func (cc clusterCaller) Quiesce(deadline time.Time) bool {
	return cc.s.waitPipelines(cc.c, deadline) && cc.s.eng.WaitWriters(deadline)
}

// Quiesce returns once every RESP pipeline and every write of the other
// front ends under way when it was called has ended, or false at
// deadline.
func (s *Server) Quiesce(deadline time.Time) bool {
	return s.waitPipelines(nil, deadline) && s.eng.WaitWriters(deadline)
}

// waitPipelines returns once every RESP pipeline under way when it was
// called, other than self's, has ended, or false at deadline.
func (s *Server) waitPipelines(self *client, deadline time.Time) bool {
	type running struct {
		c *client
		n int64
	}
	var busy []running
	s.mu.Lock()
	for _, c := range s.mu.clients {
		if n := c.pipes.Load(); c != self && n%2 == 1 {
			busy = append(busy, running{c, n})
		}
	}
	s.mu.Unlock()
	for _, r := range busy {
		for r.c.pipes.Load() == r.n {
			if time.Now().After(deadline) {
				return false
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	return true
}

// cmdCounterHit is SLUICE.COUNTERHIT, what a node forwards to the owner
// of a rule's counter (clusternode.Node.CounterHit).
func cmdCounterHit(s *Server, c *client, args [][]byte) {
	if s.clus == nil {
		// Only nodes send it, to the owner of a counter: a standalone
		// server has no business applying another's clock and hits.
		s.replyErr(c, errCounterHitStandalone)
		return
	}
	if err := s.clus.CounterHit(&c.Ctx, args, s.pol, s.rls, s.eng); err != nil {
		s.replyErr(c, err)
	}
}

// commandGetKeys answers COMMAND GETKEYS from the command table's key
// positions, as cluster clients ask it for commands they do not know.
func (s *Server) commandGetKeys(c *client, args [][]byte) {
	if len(args) < 3 {
		s.replyErr(c, errs.WrongArgs("command|getkeys"))
		return
	}
	cmd := s.cmds[strings.ToLower(string(args[2]))]
	if cmd == nil {
		s.replyErr(c, resp.Error("ERR Invalid command specified"))
		return
	}
	call := args[2:]
	if (cmd.Arity > 0 && len(call) != cmd.Arity) || (cmd.Arity < 0 && len(call) < -cmd.Arity) {
		s.replyErr(c, resp.Error("ERR Invalid number of arguments specified for command"))
		return
	}
	if cmd.First == 0 {
		s.replyErr(c, resp.Error("ERR The command has no key arguments"))
		return
	}
	last := cmd.Last
	if last < 0 {
		last += len(call)
	}
	var keys [][]byte
	for i := cmd.First; i <= last && i < len(call); i += cmd.Step {
		keys = append(keys, call[i])
	}
	c.Out = resp.AppendArray(c.Out, len(keys))
	for _, k := range keys {
		c.Out = resp.AppendBulk(c.Out, k)
	}
}

var clusterDoc = &cmddoc.Doc{
	Summary: "Cluster mode: INFO, MYID, KEYSLOT, SLOTS, SHARDS, NODES as Redis Cluster answers them; TOPOLOGY and SETTOPOLOGY read and push the topology (epoch, nodes and their slots); MIGRATE, IMPORT, DUMP, RESTORE and DROP move slots (sluice cluster rebalance drives them).",
	Group:   "cluster",
	Args:    []cmddoc.Arg{{Name: "subcommand", Type: "string"}, {Name: "arg", Type: "string", Optional: true, Multiple: true}},
}

var askingDoc = &cmddoc.Doc{Summary: "Accepted for cluster clients; slots move with a write pause, not ASK redirections.", Group: "cluster"}
var readonlyDoc = &cmddoc.Doc{Summary: "Accepted for cluster clients; no replica serves reads: a follower of a replicated shard answers MOVED to its leader.", Group: "cluster"}
var readwriteDoc = &cmddoc.Doc{Summary: "Accepted for cluster clients; no replica serves reads: a follower of a replicated shard answers MOVED to its leader.", Group: "cluster"}
var counterHitDoc = &cmddoc.Doc{
	Summary: "Cluster mode, between nodes: applies hits of a rule, under a limit, to a rule counter this node owns and answers the outcome; a node receiving a HIT or GET /check sends it to the counter's owner.",
	Group:   "cluster",
	Args: []cmddoc.Arg{{Name: "counter-key", Type: "string"}, {Name: "rule-position", Type: "integer"}, {Name: "now-ns", Type: "integer"},
		{Name: "limit", Type: "integer"}, {Name: "hits", Type: "integer"}},
}
