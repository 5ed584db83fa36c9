package respserver

import (
	"github.com/sluicehq/sluice/internal/cmddoc"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/storage"
)

var delDoc = &cmddoc.Doc{
	Summary: "Removes every limit stored under the keys, of every kind (token buckets, GCRA, fixed windows, sliding logs); returns how many keys had one.",
	Group:   "generic",
	Args:    []cmddoc.Arg{{Name: "key", Type: "key", Multiple: true}},
}

// delMutator deletes a record that exists, and notes that it did.
type delMutator struct{ deleted bool }

func (m *delMutator) Mutate(_ []byte, found bool) ([]byte, storage.Op, error) {
	if !found {
		return nil, storage.Keep, nil
	}
	m.deleted = true
	return nil, storage.Delete, nil
}

// cmdDel is DEL key [key ...]: it removes every record stored under each
// key, of every kind that has a client key (token buckets of every
// parameter set, GCRA, windows, logs), and answers how many of the keys had one.
//
// A key's records are all in its hash slot's range of the store. DEL first
// commits this connection's writes and waits until every change committed
// before it is in Pebble, then reads the slot's range for the key's records
// and deletes each under its lock, through the same ordered path as every
// write: a record changed meanwhile is deleted in its current state, and
// one created after the read is not (it was created after the DEL).
func cmdDel(s *Server, c *client, args [][]byte) {
	for _, k := range args[1:] {
		if err := s.eng.CheckKeySize("key", len(k)); err != nil {
			s.replyErr(c, err)
			return
		}
	}
	if err := s.commitWrites(c); err != nil {
		s.replyErr(c, err)
		return
	}
	if err := s.store.Flush(); err != nil {
		s.replyErr(c, engine.StoreErr(err))
		return
	}
	var n int64
	for _, key := range args[1:] {
		lo, hi := keyspace.SlotRange(keyspace.Slot(key))
		c.del = c.del[:0]
		c.delEnds = c.delEnds[:0]
		err := s.store.Scan(lo[:], hi[:], func(k, _ []byte) bool {
			if keyspace.ClientKey(k, key) {
				c.del = append(c.del, k...)
				c.delEnds = append(c.delEnds, len(c.del))
			}
			return true
		})
		if err != nil {
			s.replyErr(c, engine.StoreErr(err))
			return
		}
		m := delMutator{}
		start := 0
		for _, end := range c.delEnds {
			if err := c.Round.Apply(c.del[start:end], &m); err != nil {
				s.replyErr(c, err)
				return
			}
			start = end
		}
		if m.deleted {
			n++
		}
	}
	if cap(c.del) > connKeepBuf {
		c.del, c.delEnds = nil, nil
	}
	c.Out = resp.AppendInt(c.Out, n)
}
