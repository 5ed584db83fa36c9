package admit

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
)

func TestBudgetFDs(t *testing.T) {
	for _, tc := range []struct {
		limit                    int
		store, reserved, clients int
		err                      bool
	}{
		{limit: 1 << 20, store: 1000, reserved: 1064, clients: 1<<20 - 1064},
		{limit: 65536, store: 1000, reserved: 1064, clients: 64472},
		{limit: 4000, store: 1000, reserved: 1064, clients: 2936},
		{limit: 1024, store: 256, reserved: 320, clients: 704},
		{limit: 256, store: 100, reserved: 164, clients: 92},
		{limit: 180, store: 100, reserved: 164, clients: 16},
		{limit: 179, err: true},
		{limit: 64, err: true},
	} {
		b, err := BudgetFDs(tc.limit)
		if tc.err {
			if !errors.Is(err, ErrFDLimit) || !strings.Contains(err.Error(), "ulimit -n") {
				t.Errorf("BudgetFDs(%d): %v, want ErrFDLimit that says what to raise", tc.limit, err)
			}
			continue
		}
		if err != nil || b.StoreFiles != tc.store || b.Reserved != tc.reserved || b.Clients() != tc.clients {
			t.Errorf("BudgetFDs(%d) = %+v (%d clients), %v; want store %d, reserved %d, clients %d",
				tc.limit, b, b.Clients(), err, tc.store, tc.reserved, tc.clients)
		}
	}
}

// New lowers MaxClients to what the budget leaves, keeps the one
// requested, and gates at the lowered one; a budget leaving too few
// clients is ErrFDLimit.
func TestNewLowersMaxClients(t *testing.T) {
	b, err := BudgetFDs(256)
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{Files: b}, 0, Shared{Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if a.Config.MaxClients != 92 || a.Requested != DefaultMaxClients || a.Max != 92 || a.Listeners.Gate != &a.Gate {
		t.Fatalf("New under a limit allowing 92: MaxClients %d, Requested %d, Max %d", a.Config.MaxClients, a.Requested, a.Max)
	}
	if a.Config.ShutdownTimeout != DefaultShutdownTimeout {
		t.Errorf("ShutdownTimeout %v, want the default %v", a.Config.ShutdownTimeout, DefaultShutdownTimeout)
	}
	if _, err := New(Config{Files: FDBudget{Limit: 170, StoreFiles: 100, Reserved: 164}}, 0, Shared{}); !errors.Is(err, ErrFDLimit) {
		t.Fatalf("New with 6 descriptors left for clients: %v, want ErrFDLimit", err)
	}
}
