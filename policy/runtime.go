package policy

import "fmt"

// LimitError is a runtime limit (WithLimit) that the rule cannot take:
// Field names the value ("creditLimit", "resetSeconds") and Problem what
// was wrong and what was expected.
type LimitError struct {
	Field, Problem string
}

// Error returns "policy: problem".
func (e *LimitError) Error() string { return "policy: " + e.Problem }

// WithLimit returns a copy of r whose creditLimit and resetSeconds are
// credit and reset, for a limit changed at runtime (POLICY LIMIT). The
// copy passes the checks a rule file's rule does with those values (a
// slidingLog's largest log, arithmetic that fits in int64 time, a quota
// rule's creditLimit at most maxQuota), so that no hit can fail on them.
// It keeps r's counter identity: a hit under the new limit counts on the
// counters r's hits filled, and returning to r keeps them too, so that a
// limit lowered in an incident applies to what each actor has used
// already. FileRule returns r.
func (r *Rule) WithLimit(credit, reset int64) (*Rule, error) {
	switch {
	case credit < 0:
		return nil, &LimitError{"creditLimit", fmt.Sprintf("creditLimit is %d; expected a non-negative integer", credit)}
	case reset < 0:
		return nil, &LimitError{"resetSeconds", fmt.Sprintf("resetSeconds is %d; expected a non-negative integer", reset)}
	}
	base := r.FileRule()
	c := *base
	c.CreditLimit, c.ResetSeconds, c.file = credit, reset, base
	f := fieldSet{r: &c, given: map[string]bool{
		"quotaField": c.QuotaField != "", "maxQuota": c.QuotaField != "",
		"burst": c.Burst > 0, "stagger": c.Stagger, "minGapMillis": c.MinGapMillis > 0,
	}}
	if field, problem := f.checkAlgorithm(); problem != "" {
		if field == "" || field == "quotaField" || field == "maxQuota" || field == "burst" || field == "minGapMillis" {
			field = "creditLimit"
		}
		return nil, &LimitError{field, problem}
	}
	return &c, nil
}

// FileRule returns the rule file's rule r was made from by WithLimit, or
// r itself.
func (r *Rule) FileRule() *Rule {
	if r.file != nil {
		return r.file
	}
	return r
}
