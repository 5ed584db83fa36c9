package policy

import (
	"errors"
	"fmt"
	"math"
	"math/bits"

	"github.com/sluicehq/sluice/bucket"
)

// Algorithm is how a rule counts: divvy's window opened by the first hit
// (the default, so every divvy file keeps its meaning) or one of the
// limiter kinds of the RL.*, FW.*, CL.* and ROLL.* commands.
type Algorithm uint8

const (
	// Divvy is divvy's fixed window, opened by the first hit: Rule.Hit.
	Divvy Algorithm = iota
	// FixedWindow is FW.INCR's window aligned to the Unix epoch, optionally
	// staggered per counter.
	FixedWindow
	// TokenBucket is RL.REDUCE's token bucket.
	TokenBucket
	// GCRA is CL.THROTTLE's generic cell rate algorithm.
	GCRA
	// SlidingLog is ROLL.LIMIT's sliding log with a minimum gap.
	SlidingLog
)

// algorithmNames are the names rule files use, by Algorithm.
var algorithmNames = [...]string{Divvy: "divvy", FixedWindow: "fixedWindow", TokenBucket: "tokenBucket", GCRA: "gcra", SlidingLog: "slidingLog"}

// String returns the name used in rule files.
func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

// parseAlgorithm reads a rule file's algorithm; empty means the default.
func parseAlgorithm(s string) (Algorithm, string) {
	if s == "" {
		return Divvy, ""
	}
	for a, name := range algorithmNames {
		if s == name {
			return Algorithm(a), ""
		}
	}
	return Divvy, fmt.Sprintf("algorithm is %q; expected divvy, fixedWindow, tokenBucket, gcra or slidingLog", s)
}

// QuotaStatus says where a hit's limit came from.
type QuotaStatus uint8

const (
	// QuotaNone: the rule has no quotaField; the limit is creditLimit.
	QuotaNone QuotaStatus = iota
	// QuotaUsed: the request's quota, within maxQuota, is the limit.
	QuotaUsed
	// QuotaClamped: the request's quota was over maxQuota; the limit is
	// maxQuota.
	QuotaClamped
	// QuotaMissing: the request lacks the quota field; the limit is
	// creditLimit.
	QuotaMissing
	// QuotaMalformed: the quota is not a non-negative decimal integer; the
	// limit is creditLimit.
	QuotaMalformed
)

// String names s for logs and tests.
func (s QuotaStatus) String() string {
	switch s {
	case QuotaNone:
		return "none"
	case QuotaUsed:
		return "used"
	case QuotaClamped:
		return "clamped"
	case QuotaMissing:
		return "missing"
	case QuotaMalformed:
		return "malformed"
	}
	return fmt.Sprintf("QuotaStatus(%d)", uint8(s))
}

// Limit returns the limit of a hit of req on r: creditLimit, or with a
// quotaField the request's value of it, a non-negative decimal integer,
// capped at maxQuota. A missing or malformed quota falls back to
// creditLimit, so a proxy that forwards no quota (an anonymous user, a
// token without the claim) gets the rule's own limit rather than an
// outage or no limit at all; the status tells which case it was. Limit
// allocates nothing.
func (r *Rule) Limit(req Request) (int64, QuotaStatus) {
	if r.QuotaField == "" {
		return r.CreditLimit, QuotaNone
	}
	v, ok := req.Get(r.QuotaField)
	if !ok {
		return r.CreditLimit, QuotaMissing
	}
	if len(v) == 0 {
		return r.CreditLimit, QuotaMalformed
	}
	var n int64
	over := false
	for _, c := range v {
		if c < '0' || c > '9' {
			return r.CreditLimit, QuotaMalformed
		}
		d := int64(c - '0')
		if n > (math.MaxInt64-d)/10 {
			over = true // digits only, but beyond int64: over any bound
			continue
		}
		n = n*10 + d
	}
	if over || n > r.MaxQuota {
		return r.MaxQuota, QuotaClamped
	}
	return n, QuotaUsed
}

// MayCount reports whether some hit on r may use a counter: the rule has a
// period and a limit, its own or a request's quota. Hits on other rules
// answer without the store.
func (r *Rule) MayCount() bool {
	return r.ResetSeconds > 0 && (r.CreditLimit > 0 || r.QuotaField != "" && r.MaxQuota > 0)
}

// PeriodMillis is the rule's period, resetSeconds, in milliseconds: the
// window of divvy and fixedWindow, the interval of slidingLog, and the
// time over which gcra and tokenBucket let the limit through.
func (r *Rule) PeriodMillis() int64 { return satMul(r.ResetSeconds, msPerSecond) }

// BurstFor is the most hits a gcra or tokenBucket counter lets through at
// once under limit: burst, or the limit when the rule sets none.
func (r *Rule) BurstFor(limit int64) int64 {
	if r.Burst > 0 {
		return r.Burst
	}
	return limit
}

// BucketParams are the RL.* parameters of a tokenBucket rule under limit
// (> 0): capacity BurstFor(limit), refilled at limit per period. When the
// smallest exact step, limit/g tokens every period/g ms with g =
// gcd(limit, period ms), fits in the bucket, that is the refill: exact, and
// as smooth as whole tokens allow. A larger step would be clamped to the
// capacity on every refill, and the rate would fall to burst per step
// (7 per 60 s with burst 1 would let 1 through per minute), so then the
// bucket gets a tokens every round(period·a/limit) ms, a the smallest count
// whose interval is at least 50 ms, but at most the burst. The rate is off
// by the rounding of that interval to whole milliseconds, half a
// millisecond per interval: under 1% when the interval is 50 ms or more (7
// per 60 s refills 1 token every 8571 ms, 7.0003 per 60 s), more when the
// burst forces a shorter one (3000 per 7 s with burst 2: 2 every 5 ms, 400
// per second instead of 428.6); more than burst per millisecond cannot be
// met and gets burst per millisecond. The parameters are part of a
// bucket's key: a hit under another quota uses another bucket (see the
// package documentation).
func (r *Rule) BucketParams(limit int64) bucket.Params {
	ms := r.PeriodMillis()
	burst := r.BurstFor(limit)
	g := gcd(limit, ms)
	if limit/g <= burst {
		return bucket.Params{Max: burst, RefillAmount: limit / g, RefillMs: ms / g}
	}
	// a = ceil(50·limit/ms), by parts so that it cannot overflow: rem < ms
	// <= MaxInt64/1000.
	q, rem := limit/ms, limit%ms
	a := satAdd(satMul(50, q), (50*rem+ms-1)/ms)
	a = max(1, min(a, burst))
	// round(ms·a/limit) in 128 bits: ms·a may overflow int64, the quotient
	// (at most 51 + ms/limit) does not.
	hi, lo := bits.Mul64(uint64(ms), uint64(a))
	lo, carry := bits.Add64(lo, uint64(limit/2), 0)
	iv, _ := bits.Div64(hi+carry, lo, uint64(limit))
	return bucket.Params{Max: burst, RefillAmount: a, RefillMs: max(int64(iv), 1)}
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// GCRAParams are the CL.PTHROTTLE parameters of a gcra rule under limit
// (> 0): limit hits per period, in bursts of up to BurstFor(limit).
func (r *Rule) GCRAParams(limit int64) bucket.GCRAParams {
	return bucket.GCRAParams{MaxBurst: r.BurstFor(limit) - 1, Count: limit, Period: r.PeriodMillis(), Unit: bucket.Millisecond}
}

// WindowParams are the FW.PINCR parameters of a fixedWindow rule under
// limit, for a hit of cost hits. A denied hit is not counted, as in divvy
// (FW.INCR's NOCOUNTBLOCKED).
func (r *Rule) WindowParams(limit, hits int64) bucket.WindowParams {
	return bucket.WindowParams{Limit: limit, Window: r.PeriodMillis(), Cost: hits, Unit: bucket.Millisecond, Stagger: r.Stagger, NoCountBlocked: true}
}

// LogParams are the ROLL.LIMIT parameters of a slidingLog rule under limit
// (> 0). A denied hit is not recorded, as in divvy (ROLL.LIMIT's
// NOCOUNTBLOCKED), so a client that keeps retrying is let through again
// as soon as its oldest hit leaves the interval.
func (r *Rule) LogParams(limit int64) bucket.LogParams {
	return bucket.LogParams{Interval: r.PeriodMillis(), Max: limit, MinDiff: r.MinGapMillis, NoCountBlocked: true}
}

// checkAlgorithm validates the algorithm's fields of a rule whose fields
// all parsed: the fields other algorithms use are refused, and the
// parameters are built for every limit a hit may have (creditLimit,
// maxQuota, and 1, the smallest quota) so that no hit can fail on them.
// line returns the line of a field, for the message.
func (f *fieldSet) checkAlgorithm() (field, problem string) {
	r := f.r
	only := func(name string, given bool, algs ...Algorithm) string {
		if !given {
			return ""
		}
		for _, a := range algs {
			if r.Algorithm == a {
				return ""
			}
		}
		if len(algs) == 1 {
			return fmt.Sprintf("%s applies only to algorithm %s; this rule's algorithm is %s", name, algs[0], r.Algorithm)
		}
		return fmt.Sprintf("%s applies only to algorithms %s and %s; this rule's algorithm is %s", name, algs[0], algs[1], r.Algorithm)
	}
	for _, c := range []struct {
		name  string
		given bool
		algs  []Algorithm
	}{
		{"stagger", f.given["stagger"], []Algorithm{FixedWindow}},
		{"burst", f.given["burst"], []Algorithm{GCRA, TokenBucket}},
		{"minGapMillis", f.given["minGapMillis"], []Algorithm{SlidingLog}},
	} {
		if p := only(c.name, c.given, c.algs...); p != "" {
			return c.name, p
		}
	}
	switch {
	case f.given["quotaField"] && !f.given["maxQuota"]:
		return "quotaField", "quotaField needs maxQuota, the largest quota a request may ask for"
	case f.given["maxQuota"] && !f.given["quotaField"]:
		return "maxQuota", "maxQuota applies only with quotaField, the request field that holds the quota"
	case f.given["quotaField"] && r.CreditLimit > r.MaxQuota:
		// A missing or malformed quota falls back to creditLimit (Limit).
		return "maxQuota", fmt.Sprintf("maxQuota is %d, less than creditLimit %d, which a request without a valid quota gets; expected maxQuota of at least creditLimit, so that no request gets more than a valid quota could ask for", r.MaxQuota, r.CreditLimit)
	case f.given["burst"] && r.Burst < 1:
		return "burst", "burst is 0; expected a positive integer (leave it out for a burst of the limit)"
	}
	if r.ResetSeconds == 0 || r.Algorithm == Divvy {
		return "", "" // divvy saturates its arithmetic, as it always has
	}
	if r.ResetSeconds > math.MaxInt64/msPerSecond {
		return "resetSeconds", fmt.Sprintf("resetSeconds is %d; expected at most %d for algorithm %s, so that the period fits in int64 milliseconds", r.ResetSeconds, math.MaxInt64/msPerSecond, r.Algorithm)
	}
	limits := []int64{r.CreditLimit}
	if r.QuotaField != "" {
		limits = append(limits, r.MaxQuota, 1)
	}
	for _, limit := range limits {
		if limit <= 0 {
			continue
		}
		// The field that sets this limit, for the message.
		limitField := "creditLimit"
		if limit != r.CreditLimit {
			limitField = "maxQuota"
			if limit != r.MaxQuota {
				limitField = "quotaField" // the smallest quota, 1
			}
		}
		var err error
		switch r.Algorithm {
		case SlidingLog:
			if limit > bucket.MaxLogMax {
				return limitField, fmt.Sprintf("%s is %d; a slidingLog keeps every hit of its interval: expected at most %d", limitField, limit, bucket.MaxLogMax)
			}
			_, err = bucket.NewLog(r.LogParams(limit))
		case GCRA:
			_, err = bucket.NewGCRA(r.GCRAParams(limit))
		}
		var ae *bucket.ArgError
		if !errors.As(err, &ae) {
			continue
		}
		field := limitField
		switch ae.Arg {
		case "interval_ms", "period":
			field = "resetSeconds"
		case "MINDIFF":
			field = "minGapMillis"
		case "max_burst":
			field = "burst"
		}
		return field, fmt.Sprintf("%s with limit %d per %d s cannot be computed in int64 time: %s: %s", r.Algorithm, limit, r.ResetSeconds, ae.Arg, ae.Msg)
	}
	return "", ""
}
