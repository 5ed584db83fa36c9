// Package conncmd is the RESP commands that need nothing of the server
// but the connection's reply buffer and its round's clock: PING, ECHO,
// SELECT and TIME, registered into the command table as any family's.
// Pure: a command appends its reply or returns the error the dispatcher
// answers.
package conncmd

import (
	"math"
	"strconv"

	"github.com/sluicehq/sluice/internal/dispatch"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/resp"
)

// Register adds PING, ECHO, SELECT and TIME to t.
func Register(t *dispatch.Table) {
	t.Add(
		dispatch.Command{Name: "ping", Arity: -1, Flags: []string{"fast"}, Run: ping},
		dispatch.Command{Name: "echo", Arity: 2, Flags: []string{"fast"}, Run: echo},
		dispatch.Command{Name: "select", Arity: 2, Flags: []string{"fast"}, Run: selectDB},
		dispatch.Command{Name: "time", Arity: 1, Flags: []string{"fast"}, Run: serverTime},
	)
}

func ping(x *dispatch.Ctx, args [][]byte) error {
	switch len(args) {
	case 1:
		x.Out = resp.AppendSimple(x.Out, "PONG")
	case 2:
		x.Out = resp.AppendBulk(x.Out, args[1])
	default:
		return errs.WrongArgs("ping")
	}
	return nil
}

func echo(x *dispatch.Ctx, args [][]byte) error {
	x.Out = resp.AppendBulk(x.Out, args[1])
	return nil
}

// selectDB answers SELECT 0, the only database, as Redis' cluster mode.
func selectDB(x *dispatch.Ctx, args [][]byte) error {
	n, ok := resp.ParseInt(args[1])
	switch {
	case !ok || n < math.MinInt32 || n > math.MaxInt32:
		return errs.NotInteger
	case n != 0:
		return resp.Error("ERR DB index is out of range")
	}
	x.Out = resp.AppendSimple(x.Out, "OK")
	return nil
}

// serverTime answers TIME from the server's clock, as the round sees it.
func serverTime(x *dispatch.Ctx, _ [][]byte) error {
	now := x.Round.Now()
	x.Out = resp.AppendArray(x.Out, 2)
	x.Out = resp.AppendBulkString(x.Out, strconv.FormatInt(now.Unix(), 10))
	x.Out = resp.AppendBulkString(x.Out, strconv.Itoa(now.Nanosecond()/1000))
	return nil
}
