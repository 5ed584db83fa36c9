package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// sluice cluster rebalance on a replicated cluster: the shards' slot
// ranges are fixed, so it moves replicas instead of slots. It plans, from
// the placement the nodes follow, the fewest replica moves that leave
// every shard on the nodes given and spread their replicas and their
// homes evenly, then makes them one shard at a time (CLUSTER PLACE on the
// placement group's leader), waiting for each move to finish before the
// next, so that a shard is never short of a caught-up replica for longer
// than one move.

// placedShards reads CLUSTER PLACEMENT's text: each shard's nodes, its
// home first, and every node the text names that is not removed (those
// of the shard lines, then those of the node lines), in order.
func placedShards(text string) (shards [][]string, nodes []string) {
	add := func(addr string) {
		if addr != "" && !slices.Contains(nodes, addr) {
			nodes = append(nodes, addr)
		}
	}
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 4 && f[0] == "shard":
			reps := strings.Split(f[3], ",")
			shards = append(shards, reps)
			for _, a := range reps {
				add(a)
			}
		case len(f) == 4 && f[0] == "node":
			add(f[2])
		}
	}
	return shards, nodes
}

// planReplicas returns where each shard of cur (its nodes, its home
// first) should go so that every shard is on nodes alone, each node holds
// as many replicas as any other give or take one, and is home to as many
// shards give or take one where the shards' nodes allow, moving as few
// replicas and homes as it can: a shard keeps the nodes it has on nodes,
// where they stand, and a node is replaced where it stands, a home last.
func planReplicas(cur [][]string, nodes []string) ([][]string, error) {
	if len(cur) == 0 {
		return nil, errors.New("the placement lists no shard")
	}
	r := len(cur[0])
	if len(nodes) < r {
		return nil, fmt.Errorf("%d nodes given; the shards have %d replicas each, each on another node: want at least %d", len(nodes), r, r)
	}
	count := map[string]int{}
	for _, n := range nodes {
		count[n] = 0
	}
	// A node not given leaves a hole where it stood, filled below.
	next := make([][]string, len(cur))
	for i, reps := range cur {
		next[i] = make([]string, r)
		for j, n := range reps {
			if _, ok := count[n]; ok {
				next[i][j] = n
				count[n]++
			}
		}
	}
	// The node of least (most) count, the first given on a tie, among
	// those ok accepts.
	pick := func(c map[string]int, least bool, ok func(string) bool) string {
		best := ""
		for _, n := range nodes {
			if ok(n) && (best == "" || (least && c[n] < c[best]) || (!least && c[n] > c[best])) {
				best = n
			}
		}
		return best
	}
	// A node over its share lets go of replicas, not homes where it can.
	most := (len(cur)*r + len(nodes) - 1) / len(nodes)
	for _, n := range nodes {
		for _, homeToo := range []bool{false, true} {
			for i := len(next) - 1; i >= 0 && count[n] > most; i-- {
				if j := slices.Index(next[i], n); j >= 0 && (j == 0) == homeToo {
					next[i][j] = ""
					count[n]--
				}
			}
		}
	}
	for i := range next {
		for j := range next[i] {
			if next[i][j] == "" {
				n := pick(count, true, func(n string) bool { return !slices.Contains(next[i], n) })
				next[i][j] = n
				count[n]++
			}
		}
	}
	// Even out: the fullest node hands a replica to the emptiest, in a
	// shard the latter does not hold, a follower's place before a home.
	for moved := true; moved; {
		moved = false
		hi := pick(count, false, func(string) bool { return true })
		lo := pick(count, true, func(string) bool { return true })
		if count[hi]-count[lo] <= 1 {
			break
		}
		for _, homeToo := range []bool{false, true} {
			for i := range next {
				j := slices.Index(next[i], hi)
				if j < 0 || (j == 0) != homeToo || slices.Contains(next[i], lo) {
					continue
				}
				next[i][j] = lo
				count[hi]--
				count[lo]++
				moved = true
				break
			}
			if moved {
				break
			}
		}
	}
	// Then the homes: a shard's home swaps places with one of its other
	// replicas, along a chain where one step does not do (u hands a home
	// to v, v one of its own to w, ...), until no node is home to two
	// more shards than another it can reach so.
	homes := map[string]int{}
	for i := range next {
		homes[next[i][0]]++
	}
	// Each hand-over lowers the sum of the squares of the homes: it ends.
	for moved := true; moved; {
		moved = false
		for _, from := range nodes {
			if moved = handHome(next, homes, from); moved {
				break
			}
		}
	}
	return next, nil
}

// handHome finds a chain of shards by which node from hands one of its
// homes to a node that is home to two fewer, breadth first, and makes it;
// it reports whether there was one.
func handHome(next [][]string, homes map[string]int, from string) bool {
	// via[v] is the shard whose home hands over to v on the way.
	via := map[string]int{from: -1}
	queue := []string{from}
	to := ""
	for len(queue) > 0 && to == "" {
		u := queue[0]
		queue = queue[1:]
		for i := range next {
			if next[i][0] != u {
				continue
			}
			for _, v := range next[i][1:] {
				if _, seen := via[v]; seen {
					continue
				}
				via[v] = i
				if homes[v] <= homes[from]-2 {
					to = v
					break
				}
				queue = append(queue, v)
			}
			if to != "" {
				break
			}
		}
	}
	if to == "" {
		return false
	}
	homes[from]--
	homes[to]++
	for v := to; v != from; {
		i := via[v]
		u := next[i][0]
		j := slices.Index(next[i], v)
		next[i][0], next[i][j] = v, u
		v = u
	}
	return true
}

// rebalanceReplicas moves the replicas of a replicated cluster's shards
// onto exactly nodes, spread evenly (planReplicas), from the placement
// text of the highest epoch the nodes follow, one shard at a time, each
// move waited for for up to wait.
func (ct *clusterTool) rebalanceReplicas(ctx context.Context, placement string, nodes []string, wait time.Duration) error {
	cur, known := placedShards(placement)
	for _, n := range nodes {
		if !slices.Contains(known, n) {
			return fmt.Errorf("sluice cluster rebalance: %s is not one of the cluster's nodes (%s): add it first with sluice cluster add-node", n, strings.Join(known, ","))
		}
	}
	next, err := planReplicas(cur, nodes)
	if err != nil {
		return fmt.Errorf("sluice cluster rebalance: %w", err)
	}
	moves := 0
	for i := range cur {
		if slices.Equal(cur[i], next[i]) {
			continue
		}
		moves++
		args := []any{"CLUSTER", "PLACE", i}
		for _, n := range next[i] {
			args = append(args, n)
		}
		epoch, err := ct.propose(ctx, nodes, args)
		if err != nil {
			return err
		}
		fmt.Fprintf(ct.out, "shard %d: %s -> %s (epoch %v)\n", i, strings.Join(cur[i], ","), strings.Join(next[i], ","), epoch)
		if err := ct.waitPlaced(ctx, i, next[i], known, time.Now().Add(wait)); err != nil {
			return err
		}
	}
	if moves == 0 {
		fmt.Fprintf(ct.out, "balanced: no replica to move\n")
		return nil
	}
	fmt.Fprintf(ct.out, "balanced: %d shards moved\n", moves)
	return nil
}

// waitPlaced waits until the move of shard to the nodes to has finished:
// each of them holds the shard, caught up to its commit (INFO
// replication's shard_<i> line, apply_lag=0), and every other node that
// answers holds none of it (one that is down lets go of it when back).
func (ct *clusterTool) waitPlaced(ctx context.Context, shard int, to, all []string, deadline time.Time) error {
	key := "shard_" + strconv.Itoa(shard) + ":"
	for {
		var pending []string
		for _, addr := range all {
			v, err := ct.do(ctx, addr, "INFO", "replication")
			holds := slices.Contains(to, addr)
			if err != nil {
				if holds {
					pending = append(pending, err.Error())
				}
				continue
			}
			info, _ := v.(string)
			line := ""
			for _, l := range strings.Split(info, "\r\n") {
				if strings.HasPrefix(l, key) {
					line = l
				}
			}
			switch {
			case holds && line == "":
				pending = append(pending, "node "+addr+": does not hold the shard yet")
			case holds && (!strings.Contains(line, ",apply_lag=0,") || strings.Contains(line, ",commit=0,")):
				pending = append(pending, "node "+addr+": catching up: "+line)
			case !holds && line != "":
				pending = append(pending, "node "+addr+": still holds the shard: "+line)
			}
		}
		if len(pending) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sluice cluster rebalance: shard %d's move to %s did not finish within --cluster-move-timeout; it goes on without this command (sluice cluster show, INFO replication): %s",
				shard, strings.Join(to, ","), strings.Join(pending, "; "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
