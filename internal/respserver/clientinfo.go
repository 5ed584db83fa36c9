package respserver

import (
	"net"
	"slices"
	"strconv"
	"syscall"
)

// CLIENT INFO and CLIENT LIST give the fields of Redis 7.2, in its order,
// because client libraries parse them by name (redis-py's client_info()
// raised KeyError on a missing one). Fields about features sluice lacks
// (pub/sub, tracking, replication) have Redis' value for a client that
// does not use them; the buffer fields are sluice's own buffers, the ones
// --maxmemory-clients counts.

// clientView is what a connection's CLIENT LIST line shows that changes
// while it runs. Only the connection's goroutine computes it (conn.view);
// it copies it into client.shown (conn.publish) before each batch of
// replies goes out and whenever it accounts its buffers, so the other
// connections read a recent copy under a lock rather than fields another
// goroutine is writing.
type clientView struct {
	name, libName, libVer string
	resp                  int
	multi                 int    // commands queued in MULTI; -1 outside one
	cmd                   string // full name of the last command; "NULL" before the first
	last                  int64  // server clock, unix ms, when the last pipeline was read

	qbuf, qbufFree int64 // query buffer: bytes of an incomplete command, and the rest of the buffers' room
	argvMem        int64 // the framed commands of the pipeline and their argument list
	multiMem       int64 // commands queued by MULTI and the keys WATCH watches
	rbs, rbp, obl  int64 // reply buffer: capacity, most bytes queued at once, bytes queued now
	omem           int64 // reply buffer and the spans of replies awaiting their commit
	totMem         int64 // every buffer of the connection, as --maxmemory-clients counts it
}

// view computes the connection's changing fields now; tot is its
// footprint, which the caller may have at hand. Only its own goroutine may
// call it.
func (cn *conn) view(tot int64) clientView {
	c := cn.cl
	qbuf := int64(cn.f.Pending())
	cmd := c.lastCmd
	if cmd == "" {
		cmd = "NULL"
	}
	return clientView{
		name: c.name, libName: c.libName, libVer: c.libVer,
		resp:     c.resp,
		multi:    c.multiCount(),
		multiMem: int64(cap(c.tx.buf) + 24*cap(c.tx.args) + 16*cap(c.tx.watches)),
		cmd:      cmd,
		last:     c.lastAt,
		qbuf:     qbuf,
		qbufFree: int64(cap(cn.rbuf)+cn.f.Footprint()) - qbuf,
		argvMem:  int64(cap(cn.obuf) + 24*cap(cn.args)),
		rbs:      int64(cap(c.Out)),
		rbp:      int64(max(c.outPeak, len(c.Out))),
		obl:      int64(len(c.Out)),
		omem:     int64(cap(c.Out) + 48*cap(c.writes)),
		totMem:   tot,
	}
}

// publish copies the connection's view, of footprint tot, for the other
// connections' CLIENT LIST.
func (cn *conn) publish(tot int64) {
	v := cn.view(tot)
	c := cn.cl
	c.shown.Lock()
	c.shown.v = v
	c.shown.Unlock()
}

func (c *client) published() clientView {
	c.shown.Lock()
	defer c.shown.Unlock()
	return c.shown.v
}

// connFD is the socket's file descriptor, read once at accept (no system
// call: Control lends the descriptor Go already holds), or -1 when the
// connection has none (a pipe in tests).
func connFD(nc net.Conn) int {
	if t, ok := nc.(interface{ NetConn() net.Conn }); ok { // TLS
		nc = t.NetConn()
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return -1
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1
	}
	fd := -1
	_ = rc.Control(func(f uintptr) { fd = int(f) })
	return fd
}

// clientInfo answers CLIENT INFO: the connection's own line.
func (s *Server) clientInfo(c *client) {
	v := c.conn.view(c.conn.footprint())
	start := len(c.Out)
	c.Out = appendClientLine(c.Out, c, &v, s.clock().UnixMilli())
	c.Out = wrapBulk(c.Out, start)
}

// clientList answers CLIENT LIST with the lines of list (clientListCmd).
// Its reply grows with the number of connections (about 280 bytes each, at
// most --maxclients), so it is written straight into the reply buffer,
// which counts against --max-reply-buffer and --maxmemory-clients and is
// sent in chunks: a client that pipelines it holds one reply at a time,
// not one per command.
func (s *Server) clientList(c *client, list []*client) {
	self := c.conn.view(c.conn.footprint()) // before the reply buffer grows
	now := s.clock().UnixMilli()
	start := len(c.Out)
	c.Out = slices.Grow(c.Out, 300*len(list)+24)
	for _, other := range list {
		if other == c {
			c.Out = appendClientLine(c.Out, c, &self, now)
			continue
		}
		v := other.published()
		c.Out = appendClientLine(c.Out, other, &v, now)
	}
	c.Out = wrapBulk(c.Out, start)
}

// wrapBulk turns b[start:] into a bulk string reply, moving it behind
// the length it had to know first.
func wrapBulk(b []byte, start int) []byte {
	n := len(b) - start
	var h [24]byte
	hdr := append(h[:0], '$')
	hdr = strconv.AppendInt(hdr, int64(n), 10)
	hdr = append(hdr, '\r', '\n')
	b = append(b, hdr...) // room; overwritten below
	copy(b[start+len(hdr):], b[start:start+n])
	copy(b[start:], hdr)
	return append(b, '\r', '\n')
}

// appendClientLine appends c's CLIENT LIST line, newline included, with
// the changing fields from v: the fixed ones (id, addresses, fd, creation
// time) never change after accept, so any connection may read them.
func appendClientLine(b []byte, c *client, v *clientView, now int64) []byte {
	num := func(b []byte, key string, n int64) []byte {
		b = append(b, key...)
		return strconv.AppendInt(b, n, 10)
	}
	str := func(b []byte, key, s string) []byte {
		b = append(b, key...)
		return append(b, s...)
	}
	b = num(b, "id=", c.id)
	b = str(b, " addr=", c.addr)
	b = str(b, " laddr=", c.laddr)
	b = num(b, " fd=", int64(c.fd))
	b = str(b, " name=", v.name)
	b = num(b, " age=", max(now-c.created.UnixMilli(), 0)/1000)
	b = num(b, " idle=", max(now-v.last, 0)/1000)
	flags := " flags=N"
	if v.multi >= 0 {
		flags = " flags=x"
	}
	b = append(b, flags...)
	b = append(b, " db=0 sub=0 psub=0 ssub=0"...)
	b = num(b, " multi=", int64(v.multi))
	b = num(b, " qbuf=", v.qbuf)
	b = num(b, " qbuf-free=", v.qbufFree)
	b = num(b, " argv-mem=", v.argvMem)
	b = num(b, " multi-mem=", v.multiMem)
	b = num(b, " rbs=", v.rbs)
	b = num(b, " rbp=", v.rbp)
	b = num(b, " obl=", v.obl)
	b = append(b, " oll=0"...) // the replies are one buffer, never a list of blocks
	b = num(b, " omem=", v.omem)
	b = num(b, " tot-mem=", v.totMem)
	b = append(b, " events=r"...) // the connection's goroutine reads it whenever it is not executing
	b = str(b, " cmd=", v.cmd)
	b = append(b, " user=default redir=-1"...)
	b = num(b, " resp=", int64(v.resp))
	b = str(b, " lib-name=", v.libName)
	b = str(b, " lib-ver=", v.libVer)
	return append(b, '\n')
}
