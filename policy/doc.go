// Package policy holds divvy-style rate-limit rules: loading and validating
// rule files, matching requests to rules, the counting of a hit under each
// rule's algorithm (Counter), the stored form of a divvy window, and the
// divvy line protocol's parsing and replies.
//
// It is pure: only Load touches the file system, and nothing reads a clock,
// takes a lock or keeps package-level state. It imports only the standard
// library and the bucket package, whose arithmetic the algorithms other
// than divvy's use. Time is an argument (unix milliseconds for Hit, unix
// nanoseconds for Counter), so every result follows from the inputs. A
// loaded *Policy and its rules are immutable and safe for concurrent use.
// Match, Get, Limit, AppendCounterID, Hit, Take, AppendWindow,
// AppendReply, a successful ParseLine and Counter.Apply (once its scratch
// space has grown) allocate nothing when the destination slices have room.
//
// # Rules
//
// A rule file is an ordered list of rules; the last one is the default,
// with an empty operation. A request, a set of key=value pairs, goes to the
// first matching rule whose matchPolicy is stop; canary rules that match
// before it are counted too but do not decide the reply. A rule matches when
// each key of its operation is in the request with a matching value:
//
//   - an exact value matches the same bytes;
//   - `*` matches any value, the empty one included, but the key must be
//     present;
//   - any other value containing `*` is a glob over the whole value, where
//     each `*` matches any run of bytes, `/` included. `*` cannot be escaped:
//     a rule cannot ask for a literal `*`.
//
// Request keys the rule does not name are ignored; when a request repeats a
// key the last value counts. Nothing is normalised.
//
// The fields of a rule are creditLimit and resetSeconds (non-negative
// integers, required), algorithm (divvy, fixedWindow, tokenBucket, gcra or
// slidingLog; divvy when left out), stagger (true or false, fixedWindow
// only), burst (a positive integer, gcra and tokenBucket only),
// minGapMillis (a non-negative integer, slidingLog only), quotaField and
// maxQuota (given together), actorField, matchPolicy (stop or canary, stop
// when left out), label and comment. An empty string field is the same as
// leaving it out; rules need no label, but a label must match
// ^[a-zA-Z0-9_-]{1,255}$ and be unique in the file.
//
// In INI files each section is a rule. The header lists the operation as
// whitespace-separated key=value tokens, [default] being the empty
// operation; a key or value may be quoted with ' or " (no escape), which it
// must be to hold white space or `=` (an unquoted value may not contain
// `=`). Indented headers are headers, dots in headers are plain characters,
// and a `]` may appear in a value. Fields are `name = value`; the value may
// be quoted with ' or "; an unquoted null is the same as leaving the field
// out (divvy's own test file writes label = null). Lines starting with # or
// ; are comments; there are no comments at the end of a line. Unknown and
// repeated fields are errors, as are repeated keys in a header.
//
// JSON files are {"overrides": [rule, ...], "default": rule}; see ParseJSON.
//
// # Validation
//
// Loading fails with a *ValidationError naming the file, the line, the rule
// and the first problem found, in file order: a syntax error, an unknown or
// repeated field, a bad integer, boolean, algorithm, matchPolicy or label, a
// field the rule's algorithm does not use, a burst of 0, quotaField without
// maxQuota or the other way round, algorithm parameters whose arithmetic
// would overflow for some limit a hit may have, a repeated label, no rules, a default rule that is not last or not stop, a last rule that is not
// a default, or an unreachable rule. A rule is unreachable when one earlier
// stop rule matches every request it matches: the earlier rule names no key
// the later one lacks, and each of its values is equal to, `*`, or a glob
// matching the later rule's value (read as text). The test never rejects a
// reachable rule; rules hidden only by several earlier rules together are
// accepted. Canary rules never hide others.
//
// # Counting
//
// Each rule with creditLimit > 0 and resetSeconds > 0 has one counter per
// actor value (the request's value of actorField; the empty string when the
// rule has none or the request lacks it). A divvy counter is a fixed window
// opened by its first hit; see Rule.Hit. The other algorithms count as
// their commands do, with the bucket package's arithmetic and state
// encodings (see Counter and the Rule methods that give their parameters),
// and a denied hit takes nothing (NOCOUNTBLOCKED) except in a tokenBucket,
// which RL.REDUCE drains.
//
// With a quotaField, a hit's limit is the request's value of it, a
// decimal integer capped at maxQuota; a missing or malformed value falls
// back to creditLimit (see Rule.Limit). A divvy window stores credits left,
// capped by the limit on each hit; fixed windows, GCRA and logs store
// counts or times the next limit reads as they are; a token bucket's
// parameters are part of its key, so another quota is another bucket. Replies give the seconds until the window
// ends rounded up: the first hit of a 3600 s window answers 3600, and a live
// window never answers 0, which is reserved for always-allow rules.
// Counters are found by Rule.AppendCounterID, which identifies a rule by
// its content, not its position.
//
// # Differences from divvy
//
// Where divvy's README and code disagree, this package follows the README.
// Choices divvy's code makes differently:
//
//   - Globs cover the whole value and every `*` is a wildcard; divvy's code
//     anchors only the start and expands only the first `*`. A `*` value
//     requires the key; divvy's code also matches requests without it.
//   - resetSeconds 0 with creditLimit > 0 loads and allows every hit (this
//     project's contract); divvy rejects it.
//   - The INI parser is not the ini package's: sections are never merged or
//     nested, values are not stripped of trailing comments, integers must be
//     whole ("10abc" is an error, not 10), and unknown fields are errors.
//   - JSON operation values must be strings (divvy converts numbers), counts
//     must be JSON integers (divvy takes "3"), unknown members are errors.
//   - The default rule must have matchPolicy stop.
//   - Line protocol: a line of only white space is ignored (divvy answers
//     unknown-command); a `"` inside an unquoted string is an error, as the
//     README's grammar says; the command word runs to the first white space
//     (divvy also stops at `=` and accepts a quoted word); white space is
//     ASCII and the word is upper-cased as ASCII in the error reply.
//   - Counter keys include the limits, as divvy's do, but also the actor
//     field, and identical rules do not share counters.
package policy
