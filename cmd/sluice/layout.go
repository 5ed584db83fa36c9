package main

import (
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/sluicehq/sluice/storage"
)

// prepareDataDir moves a store kept directly in moveFrom into data (see
// storage.Relocate), and refuses to start a new store in data while the
// directory above it holds one: that is a volume laid out the old way,
// whose limits a new, empty store would silently forget.
func prepareDataDir(data, moveFrom string, log *slog.Logger) error {
	if moveFrom != "" {
		moved, err := storage.Relocate(moveFrom, data)
		if err != nil {
			return fmt.Errorf("--move-store-from %s: %w", moveFrom, err)
		}
		if moved {
			log.Info("moved the store into its own directory", "from", moveFrom, "to", data)
		}
	}
	abs, err := filepath.Abs(data)
	if err != nil {
		return fmt.Errorf("--data %s: %w", data, err)
	}
	if here, err := storage.HoldsStore(abs); err != nil || here {
		return err // a store is there; or Open says why it cannot read it
	}
	parent := filepath.Dir(abs)
	if above, err := storage.HoldsStore(parent); err == nil && above && parent != abs {
		return fmt.Errorf("--data %s holds no store, and the directory above it, %s, holds one: to move that store into %s, start with --move-store-from %s; to serve it where it is, with --data %s", data, parent, data, parent, parent)
	}
	return nil
}
