package policycmd

import (
	"math"
	"strconv"

	"github.com/sluicehq/sluice/internal/dispatch"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/peakstats"
	"github.com/sluicehq/sluice/internal/resp"
)

// POLICY STATS: a rule's threshold data (engine.Stats).

// Stats is a label's threshold data as POLICY STATS and GET
// /v1/policy/stats/ answer them.
type Stats struct {
	Label string `json:"label"`
	// From and To are the days covered, UTC.
	From string `json:"from"`
	To   string `json:"to"`
	// Windows are the actor-windows that ended, WindowsRefused those
	// whose peak used reached their limit.
	Windows        uint64 `json:"windows"`
	WindowsRefused uint64 `json:"windowsRefused"`
	// Actors and ActorsRefused are the distinct actors seen and with a
	// refused window: exact when ActorsExact, else estimates within
	// ActorsStdErr (relative, one standard error).
	Actors        int64   `json:"actors"`
	ActorsRefused int64   `json:"actorsRefused"`
	ActorsExact   bool    `json:"actorsExact"`
	ActorsStdErr  float64 `json:"actorsStdErr"`
	// Peak is the largest peak used and its quantiles (p50, p90, p99,
	// p99.9); a quantile is at most PeakRelErr above the true one (0 when
	// every one is exact).
	PeakMax    int64           `json:"peakMax"`
	Peaks      []QuantilePeak  `json:"peaks"`
	PeakRelErr float64         `json:"peakRelErr"`
	WhatIf     *WhatIfRefusals `json:"whatif,omitempty"`
}

// QuantilePeak is a quantile of the peak used, -1 with no window.
type QuantilePeak struct {
	Quantile string `json:"quantile"`
	Peak     int64  `json:"peak"`
}

// WhatIfRefusals is what a candidate limit would have refused.
type WhatIfRefusals struct {
	Limit int64 `json:"limit"`
	// Windows is the share of actor-windows that peaked over Limit, off
	// by at most WindowsErr; Actors the share of distinct actors with
	// such a window, within ActorsStdErr (one standard error; 0 when
	// exact).
	Windows      float64 `json:"windows"`
	WindowsErr   float64 `json:"windowsErr"`
	Actors       float64 `json:"actors"`
	ActorsStdErr float64 `json:"actorsStdErr"`
}

// quantileNames name engine.StatsQuantiles.
var quantileNames = [len(engine.StatsQuantiles)]string{"p50", "p90", "p99", "p99.9"}

// Stats returns label's threshold data over the retained days, with what
// limit would have refused when whatif is not nil.
func (c *Commands) Stats(label string, whatif *int64) (*Stats, error) {
	if err := CheckLabel([]byte(label)); err != nil {
		return nil, err
	}
	st, err := c.Engine.Stats(c.Rules.Current(), label)
	if err != nil {
		return nil, err
	}
	d := st.Day
	out := &Stats{Label: label, From: st.From, To: st.To, Windows: d.Windows, WindowsRefused: d.Refused, PeakMax: d.Max}
	n, exact := d.Actors()
	out.Actors, out.ActorsExact = int64(math.Round(n)), exact
	n, _ = d.RefusedActors()
	out.ActorsRefused = int64(math.Round(n))
	if !exact {
		out.ActorsStdErr = peakstats.ActorsStdErr
	}
	for i, q := range engine.StatsQuantiles {
		v, exact := d.Quantile(q)
		out.Peaks = append(out.Peaks, QuantilePeak{quantileNames[i], v})
		if !exact {
			out.PeakRelErr = peakstats.RelativeWidth
		}
	}
	if whatif != nil {
		w := d.WhatIf(*whatif)
		out.WhatIf = &WhatIfRefusals{Limit: *whatif, Windows: w.Windows, WindowsErr: w.WindowsErr, Actors: w.Actors, ActorsStdErr: w.ActorsStdErr}
	}
	return out, nil
}

// stats is POLICY STATS <label> [WHATIF <limit>]: a flat array of names
// and values, shares as decimal strings.
func (c *Commands) stats(x *dispatch.Ctx, args [][]byte) error {
	var whatif *int64
	switch {
	case len(args) == 3 && resp.EqualFold(args[1], "whatif"):
		l, err := ParseLimit(args[2])
		if err != nil {
			return err
		}
		whatif = &l
	case len(args) != 1:
		return errs.New(errs.Request, "POLICY STATS takes a label and optionally WHATIF <limit>; expected POLICY STATS <label> [WHATIF <limit>]")
	}
	st, err := c.Stats(string(args[0]), whatif)
	if err != nil {
		return err
	}
	n := 2 * (11 + len(st.Peaks))
	if whatif != nil {
		n += 2 * 5
	}
	out := resp.AppendArray(x.Out, n)
	out = str(out, "label", st.Label)
	out = str(out, "from", st.From)
	out = str(out, "to", st.To)
	out = num(out, "windows", int64(st.Windows))
	out = num(out, "windowsRefused", int64(st.WindowsRefused))
	out = num(out, "actors", st.Actors)
	out = num(out, "actorsRefused", st.ActorsRefused)
	out = str(out, "actorsExact", strconv.FormatBool(st.ActorsExact))
	out = str(out, "actorsStdErr", share(st.ActorsStdErr))
	out = num(out, "peakMax", st.PeakMax)
	for _, p := range st.Peaks {
		out = num(out, p.Quantile, p.Peak)
	}
	out = str(out, "peakRelErr", share(st.PeakRelErr))
	if w := st.WhatIf; w != nil {
		out = num(out, "whatifLimit", w.Limit)
		out = str(out, "whatifWindows", share(w.Windows))
		out = str(out, "whatifWindowsErr", share(w.WindowsErr))
		out = str(out, "whatifActors", share(w.Actors))
		out = str(out, "whatifActorsStdErr", share(w.ActorsStdErr))
	}
	x.Out = out
	return nil
}

// ParseLimit reads WHATIF's limit, a non-negative integer, or says what
// was wrong.
func ParseLimit(b []byte) (int64, error) { return count("limit", b) }

// share formats a share or an error to 6 decimals.
func share(f float64) string { return strconv.FormatFloat(f, 'f', 6, 64) }
