// Package cmddoc is what COMMAND, COMMAND INFO and COMMAND DOCS say about
// the commands: the documentation records redis-cli builds its HELP text
// and Tab completion from, the records of the server's own commands, and
// the encoders of both replies. It is pure: no I/O, no state; the records
// are fixed at build time and never modified.
package cmddoc

import "github.com/sluicehq/sluice/internal/resp"

// Doc is a command's COMMAND DOCS record: what redis-cli and client
// libraries show as its help and argument hints.
type Doc struct {
	Summary string
	Group   string
	Args    []Arg
}

// Since is every record's "since": the sluice version a command first
// appeared in is not tracked, and redis-cli only prints the field in HELP,
// so every command says it has been there since the first release.
const Since = "1.0.0"

// Arg is one argument of a Doc, in Redis' terms: Type is "key",
// "integer", "unix-time", "pure-token", or "oneof" with its choices in
// Args; Token is the keyword before the value, if any.
type Arg struct {
	Name, Type, Token  string
	Optional, Multiple bool
	Args               []Arg // of a "oneof" or "block"
}

// Sub is a subcommand of a container command (CLIENT, COMMAND, CONFIG,
// POLICY), named like Redis' "client|info". COMMAND and COMMAND DOCS list
// it under its container, as Redis 7 does, which is how redis-cli learns
// "CLIENT SETNAME" for HELP and Tab completion; CLIENT LIST's cmd field
// names it.
type Sub struct {
	Name  string
	Arity int
	Flags []string
	Doc   Doc
}

// Append appends d as COMMAND DOCS gives it: a map of summary, since,
// group, arguments and, for a container, subcommands: a map from each
// subcommand's full name to its own record.
func (d *Doc) Append(b []byte, r3 bool, subs []Sub) []byte {
	n := 4
	if len(subs) > 0 {
		n++
	}
	b = resp.AppendMap(b, n, r3)
	b = resp.AppendBulkString(b, "summary")
	b = resp.AppendBulkString(b, d.Summary)
	b = resp.AppendBulkString(b, "since")
	b = resp.AppendBulkString(b, Since)
	b = resp.AppendBulkString(b, "group")
	b = resp.AppendBulkString(b, d.Group)
	b = resp.AppendBulkString(b, "arguments")
	b = appendArgs(b, d.Args, r3)
	if len(subs) > 0 {
		b = resp.AppendBulkString(b, "subcommands")
		b = resp.AppendMap(b, len(subs), r3)
		for i := range subs {
			b = resp.AppendBulkString(b, subs[i].Name)
			b = subs[i].Doc.Append(b, r3, nil)
		}
	}
	return b
}

func appendArgs(b []byte, args []Arg, r3 bool) []byte {
	b = resp.AppendArray(b, len(args))
	for _, a := range args {
		var flags []string
		if a.Optional {
			flags = append(flags, "optional")
		}
		if a.Multiple {
			flags = append(flags, "multiple")
		}
		n := 2
		if a.Token != "" {
			n++
		}
		if len(flags) > 0 {
			n++
		}
		if len(a.Args) > 0 {
			n++
		}
		b = resp.AppendMap(b, n, r3)
		b = resp.AppendBulkString(b, "name")
		b = resp.AppendBulkString(b, a.Name)
		b = resp.AppendBulkString(b, "type")
		b = resp.AppendBulkString(b, a.Type)
		if a.Token != "" {
			b = resp.AppendBulkString(b, "token")
			b = resp.AppendBulkString(b, a.Token)
		}
		if len(flags) > 0 {
			b = resp.AppendBulkString(b, "flags")
			b = resp.AppendArray(b, len(flags))
			for _, f := range flags {
				b = resp.AppendSimple(b, f)
			}
		}
		if len(a.Args) > 0 {
			b = resp.AppendBulkString(b, "arguments")
			b = appendArgs(b, a.Args, r3)
		}
	}
	return b
}

// AppendInfo appends a command's COMMAND reply, the ten elements of Redis
// 7: name, arity, flags, first key, last key, step, ACL categories, tips,
// key specs, and the subcommands, each its own ten elements.
func AppendInfo(b []byte, name string, arity int, flags []string, first, last, step int, subs []Sub) []byte {
	b = appendInfoHead(b, name, arity, flags, first, last, step)
	b = resp.AppendArray(b, len(subs))
	for i := range subs {
		b = AppendSubInfo(b, &subs[i])
	}
	return b
}

// AppendSubInfo appends a subcommand's COMMAND reply.
func AppendSubInfo(b []byte, sc *Sub) []byte {
	b = appendInfoHead(b, sc.Name, sc.Arity, sc.Flags, 0, 0, 0)
	return resp.AppendArray(b, 0)
}

// appendInfoHead appends the first nine elements of a COMMAND reply.
func appendInfoHead(b []byte, name string, arity int, flags []string, first, last, step int) []byte {
	b = resp.AppendArray(b, 10)
	b = resp.AppendBulkString(b, name)
	b = resp.AppendInt(b, int64(arity))
	b = resp.AppendArray(b, len(flags))
	for _, f := range flags {
		b = resp.AppendSimple(b, f)
	}
	b = resp.AppendInt(b, int64(first))
	b = resp.AppendInt(b, int64(last))
	b = resp.AppendInt(b, int64(step))
	b = resp.AppendArray(b, 0)    // ACL categories
	b = resp.AppendArray(b, 0)    // tips
	return resp.AppendArray(b, 0) // key specs
}
