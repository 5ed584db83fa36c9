package respserver

import (
	"cmp"
	"net"
	"slices"
	"strings"

	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/resp"
)

// CLIENT KILL and CLIENT LIST's filters follow Redis 7.4
// (clientCommand in networking.c), replies and errors included, since ops
// tools and client libraries send them as they send them to Redis. Every
// sluice connection is of Redis' type normal: there are no replicas,
// masters or pub/sub clients. There is one user, default.

// clientType reads a CLIENT KILL or LIST TYPE: normal, master, replica
// (or slave) or pubsub, any case. ok is false for another.
func clientType(b []byte) (normal, ok bool) {
	switch strings.ToLower(string(b)) {
	case "normal":
		return true, true
	case "master", "replica", "slave", "pubsub":
		return false, true
	}
	return false, false
}

func errUnknownClientType(b []byte) error {
	return resp.Error("ERR Unknown client type '" + resp.Preview(b) + "'")
}

// clientListCmd answers CLIENT LIST [TYPE type | ID id [id ...]].
func (s *Server) clientListCmd(c *client, args [][]byte) {
	switch {
	case len(args) == 2:
		s.clientList(c, s.clientsByID(nil))
	case len(args) == 4 && resp.EqualFold(args[2], "type"):
		normal, ok := clientType(args[3])
		if !ok {
			s.replyErr(c, errUnknownClientType(args[3]))
			return
		}
		var list []*client
		if normal {
			list = s.clientsByID(nil)
		}
		s.clientList(c, list)
	case len(args) > 3 && resp.EqualFold(args[2], "id"):
		ids := make([]int64, 0, len(args)-3)
		for _, a := range args[3:] {
			id, ok := resp.ParseInt(a)
			if !ok {
				s.replyErr(c, resp.Error("ERR Invalid client ID"))
				return
			}
			ids = append(ids, id)
		}
		s.clientList(c, s.clientsByID(ids))
	default:
		s.replyErr(c, errs.Syntax)
	}
}

// clientsByID returns the connections with these IDs, in their order and
// leaving out those that are gone, as Redis lists them; nil ids is every
// connection, by ID.
func (s *Server) clientsByID(ids []int64) []*client {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ids == nil {
		list := make([]*client, 0, len(s.mu.clients))
		for _, other := range s.mu.clients {
			list = append(list, other)
		}
		slices.SortFunc(list, func(a, b *client) int { return cmp.Compare(a.id, b.id) })
		return list
	}
	var list []*client
	for _, id := range ids {
		if other := s.mu.clients[id]; other != nil {
			list = append(list, other)
		}
	}
	return list
}

// killFilter is what CLIENT KILL's options ask for: a connection matches
// when it matches every option given.
type killFilter struct {
	id          int64  // 0: any
	addr, laddr string // "": any
	none        bool   // TYPE master, replica or pubsub: no sluice connection
	maxAge      int64  // seconds; 0: any
	skipMe      bool
}

// clientKill answers CLIENT KILL addr:port (OK, or ERR No such client) and
// CLIENT KILL option value ... (the number of connections closed; the
// caller's own is skipped unless SKIPME no).
func (s *Server) clientKill(c *client, args [][]byte) {
	f := killFilter{skipMe: true}
	if len(args) == 3 {
		f.addr, f.skipMe = string(args[2]), false // the old form may kill itself
	} else if err := f.parse(args[2:]); err != nil {
		s.replyErr(c, err)
		return
	}
	now := s.clock().Unix()
	var victims []*client
	for _, other := range s.clientsByID(nil) {
		if f.matches(other, c, now) {
			victims = append(victims, other)
		}
	}
	for _, v := range victims {
		if v == c {
			c.quit = true // after this reply, as Redis' CLOSE_AFTER_REPLY
		} else {
			v.conn.kill()
		}
	}
	switch {
	case len(args) > 3:
		c.Out = resp.AppendInt(c.Out, int64(len(victims)))
	case len(victims) == 0:
		s.replyErr(c, resp.Error("ERR No such client"))
	default:
		c.Out = resp.AppendSimple(c.Out, "OK")
	}
}

// parse reads CLIENT KILL's option and value pairs.
func (f *killFilter) parse(opts [][]byte) error {
	for i := 0; i < len(opts); i += 2 {
		if i+1 == len(opts) {
			return errs.Syntax
		}
		v := opts[i+1]
		switch strings.ToLower(string(opts[i])) {
		case "id":
			n, ok := resp.ParseInt(v)
			if !ok || n < 1 {
				return resp.Error("ERR client-id should be greater than 0")
			}
			f.id = n
		case "maxage":
			n, ok := resp.ParseInt(v)
			if !ok {
				return resp.Error("ERR maxage is not an integer or out of range")
			}
			if n <= 0 {
				return resp.Error("ERR maxage should be greater than 0")
			}
			f.maxAge = n
		case "type":
			normal, ok := clientType(v)
			if !ok {
				return errUnknownClientType(v)
			}
			f.none = !normal
		case "addr":
			f.addr = string(v)
		case "laddr":
			f.laddr = string(v)
		case "user":
			if string(v) != "default" {
				return resp.Error("ERR No such user '" + resp.Preview(v) + "'")
			}
		case "skipme":
			switch {
			case resp.EqualFold(v, "yes"):
				f.skipMe = true
			case resp.EqualFold(v, "no"):
				f.skipMe = false
			default:
				return errs.Syntax
			}
		default:
			return errs.Syntax
		}
	}
	return nil
}

// matches reports whether other is to be killed by self's CLIENT KILL at
// now (unix seconds, server clock). Only fields fixed at accept are read.
func (f *killFilter) matches(other, self *client, now int64) bool {
	switch {
	case f.none,
		other.conn != nil && other.conn.killed.Load(), // still closing
		f.id != 0 && other.id != f.id,
		f.addr != "" && other.addr != f.addr,
		f.laddr != "" && other.laddr != f.laddr,
		f.skipMe && other == self,
		f.maxAge != 0 && now-other.created.Unix() < f.maxAge:
		return false
	}
	return true
}

// kill ends the connection for another's CLIENT KILL, as Redis frees a
// killed client at once: its socket is closed under it, so a read or a
// write it is blocked in returns. A pipeline it is executing finishes (its
// writes are committed) but its replies are lost. A TLS connection's
// socket is closed without a close_notify, which could wait for a client
// that does not read.
func (cn *conn) kill() {
	cn.killed.Store(true)
	cn.draining.Store(true)
	cn.closeOnce.Do(func() {
		nc := cn.nc
		if t, ok := nc.(interface{ NetConn() net.Conn }); ok {
			nc = t.NetConn()
		}
		_ = nc.Close()
	})
}
