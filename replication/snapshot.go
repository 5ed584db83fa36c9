package replication

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// A snapshot on the wire, after the transport's own header:
//
//	uvarint len, the MsgSnap message (raftpb)
//	pages: uvarint count, uvarint len from, from, uvarint len to, to,
//	       count × (uvarint len key, key, uvarint len value, value)
//	a last page has to == the group's Upper
//
// Each page replaces the follower's records in [from, to) with its own, so
// the pages together replace the shard's key range; they are read from one
// Pebble snapshot on the leader, so they hold the state at one applied
// index, the message's or a later one (the leader applies on while Raft
// asks for the snapshot). A later one is harmless: a round carries final
// values, not changes, so applying again the entries between the two
// indexes ends in the same state.

// Bounds on what a snapshot stream may carry, so that a bad peer cannot
// make a replica allocate without limit.
const (
	snapshotPageBytes = 1 << 20  // what a sender puts in one page
	maxSnapshotPage   = 64 << 20 // what a receiver accepts in one page
	maxSnapshotMsg    = 1 << 20  // the message, whose Data is empty
)

// ErrBadSnapshot is the error for a snapshot stream that does not decode
// or does not fit the group.
var ErrBadSnapshot = errors.New("replication: bad snapshot stream")

// ErrStaleSnapshot says a snapshot was not applied because the replica's
// log already holds its index.
var ErrStaleSnapshot = errors.New("replication: snapshot older than what the replica has")

// WriteSnapshot writes the snapshot message m (a MsgSnap this replica's
// Ready handed to Send) and the group's records, read from a snapshot of
// the store taken now, to w. The caller reports the outcome with
// ReportSnapshot.
func (g *Group) WriteSnapshot(w io.Writer, m *pb.Message) error {
	if m.GetType() != pb.MsgSnap {
		return fmt.Errorf("replication: WriteSnapshot of a %v", m.GetType())
	}
	view, err := g.cfg.Store.NewReplicaSnapshot()
	if err != nil {
		return err
	}
	defer view.Close()
	bw := bufio.NewWriterSize(w, 64<<10)
	mb, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	sent, _ := bw.Write(appendBytes(nil, mb))

	var (
		page  []byte
		count uint64
		from  = g.cfg.Lower
	)
	flush := func(to []byte) error {
		var hdr []byte
		hdr = binary.AppendUvarint(hdr, count)
		hdr = appendBytes(hdr, from)
		hdr = appendBytes(hdr, to)
		n, _ := bw.Write(hdr)
		m, err := bw.Write(page)
		sent += n + m
		page, count, from = page[:0], 0, to
		return err
	}
	var werr error
	err = view.Scan(g.cfg.Lower, g.cfg.Upper, func(k, v []byte) bool {
		page = appendBytes(page, k)
		page = appendBytes(page, v)
		count++
		if len(page) >= snapshotPageBytes {
			// The next page starts right after this key.
			werr = flush(append(bytes.Clone(k), 0))
		}
		return werr == nil
	})
	if err == nil {
		err = werr
	}
	if err == nil {
		err = flush(g.cfg.Upper)
	}
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		return fmt.Errorf("replication: group %d: write snapshot: %w", g.cfg.Group, err)
	}
	g.stats.snapSent.Add(1)
	g.stats.snapSentBytes.Add(int64(sent))
	return nil
}

// ReadSnapshot reads a snapshot stream that WriteSnapshot wrote, replaces
// the group's records with its records, page by page, and hands the
// message to Raft, whose next Ready makes the log start after it (a synced
// write, which makes the pages before it durable too). The replica
// processes nothing else meanwhile. A snapshot whose index the replica
// has committed already is refused with ErrStaleSnapshot, and nothing is
// written.
//
// A stream cut midway leaves some pages applied: those records are then
// ahead of the applied index, which the entries applied next, and the
// snapshot the leader sends again, bring level. Raft never elects a
// replica that lacks committed entries, so such a replica does not lead.
func (g *Group) ReadSnapshot(r io.Reader) error { return g.readSnapshot(r, 0) }

// readSnapshot is ReadSnapshot of a stream from node sender, whose
// message must say so; 0 takes any sender.
func (g *Group) readSnapshot(r io.Reader, sender uint64) error {
	cr := &countReader{r: r}
	br := bufio.NewReaderSize(cr, 64<<10)
	mb, err := readBytes(br, maxSnapshotMsg)
	if err != nil {
		return fmt.Errorf("%w: message: %w", ErrBadSnapshot, err)
	}
	m := &pb.Message{}
	if err := proto.Unmarshal(mb, m); err != nil {
		return fmt.Errorf("%w: message: %w", ErrBadSnapshot, err)
	}
	if m.GetType() != pb.MsgSnap || m.GetTo() != g.cfg.Node || m.GetSnapshot().GetMetadata() == nil {
		return fmt.Errorf("%w: a %v for node %d, want a MsgSnap for node %d", ErrBadSnapshot, m.GetType(), m.GetTo(), g.cfg.Node)
	}
	if sender != 0 && m.GetFrom() != sender {
		return fmt.Errorf("%w: a snapshot of node %d sent by node %d", ErrBadSnapshot, m.GetFrom(), sender)
	}
	if err := g.checkMessage(m); err != nil {
		return fmt.Errorf("%w: %w", ErrBadSnapshot, err)
	}
	index := m.GetSnapshot().GetMetadata().GetIndex()

	g.procMu.Lock()
	defer g.procMu.Unlock()
	if err := g.failedErr(); err != nil {
		return err
	}
	g.mu.Lock()
	commit := g.mu.rn.BasicStatus().GetCommit()
	g.mu.Unlock()
	if index <= commit {
		return fmt.Errorf("%w: index %d, committed %d", ErrStaleSnapshot, index, commit)
	}
	b := g.batch
	defer b.Reset()
	from := g.cfg.Lower
	keys := map[string]struct{}{}
	for {
		n, err := binary.ReadUvarint(br)
		if err != nil {
			return fmt.Errorf("%w: page header: %w", ErrBadSnapshot, err)
		}
		pfrom, err := readBytes(br, maxSnapshotPage)
		if err != nil {
			return fmt.Errorf("%w: page start: %w", ErrBadSnapshot, err)
		}
		to, err := readBytes(br, maxSnapshotPage)
		if err != nil {
			return fmt.Errorf("%w: page end: %w", ErrBadSnapshot, err)
		}
		if !bytes.Equal(pfrom, from) || bytes.Compare(to, from) <= 0 || bytes.Compare(to, g.cfg.Upper) > 0 {
			return fmt.Errorf("%w: page [%q, %q) after %q in group range [%q, %q)", ErrBadSnapshot, pfrom, to, from, g.cfg.Lower, g.cfg.Upper)
		}
		clear(keys)
		size := 0
		var prev []byte
		for i := uint64(0); i < n; i++ {
			k, err := readBytes(br, maxSnapshotPage)
			if err == nil {
				var v []byte
				v, err = readBytes(br, maxSnapshotPage)
				size += len(k) + len(v)
				switch {
				case err != nil:
				case size > maxSnapshotPage:
					err = fmt.Errorf("page over %d bytes", maxSnapshotPage)
				case bytes.Compare(k, from) < 0 || bytes.Compare(k, to) >= 0 || (prev != nil && bytes.Compare(k, prev) <= 0):
					err = fmt.Errorf("key %q out of order or outside [%q, %q)", k, from, to)
				case g.own:
					err = b.Set(k, v)
				default:
					err = b.PutRecord(k, v)
				}
			}
			if err != nil {
				return fmt.Errorf("%w: record %d: %w", ErrBadSnapshot, i, err)
			}
			keys[string(k)] = struct{}{}
			prev = k
		}
		// The replica's records of the page's range that the leader does
		// not have go.
		scan, del := g.cfg.Store.Scan, b.DeleteRecord
		if g.own {
			scan, del = g.cfg.Store.ReplicaScan, b.Delete
		}
		_, _, err = deleteKeys(b, scan, del, from, to, 0, func(k []byte) bool {
			_, ok := keys[string(k)]
			return !ok
		})
		if err != nil {
			return fmt.Errorf("replication: group %d: apply snapshot page: %w", g.cfg.Group, err)
		}
		from = to
		if bytes.Equal(to, g.cfg.Upper) {
			break
		}
	}
	err = g.raft(func(rn *raft.RawNode) error {
		err := rn.Step(m)
		if err == nil {
			g.mu.heard[m.GetFrom()] = g.mu.ticks
		}
		return err
	})
	g.notify()
	if err != nil {
		return fmt.Errorf("replication: group %d: step snapshot: %w", g.cfg.Group, err)
	}
	g.stats.snapReceived.Add(1)
	g.stats.snapReceivedBytes.Add(cr.n - int64(br.Buffered()))
	return nil
}

func readBytes(r *bufio.Reader, limit int) ([]byte, error) {
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return nil, err
	}
	if n > uint64(limit) {
		return nil, fmt.Errorf("length %d over %d", n, limit)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	return b, nil
}
