package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/cmd/sluice/internal/daemon"
)

// inspect asks a daemon over gRPC for a key's state on its owner and
// prints it, as GET /v1/admin/keys answers it with --json.
func (a *app) inspect(ctx context.Context, args []string) error {
	cmd := a.keyCommand("inspect", "Prints a key's state as its owner holds it, with the owner and the nodes holding copies. Changes nothing.")
	asJSON := cmd.fs.Bool("json", false, "print the state as JSON, as the HTTP API does")
	c, stop, err := cmd.start(args)
	if stop {
		return err
	}
	defer c.Close()
	name, key := *cmd.name, *cmd.key
	ins, err := c.Inspect(ctx, name, key)
	if err != nil {
		return cmd.conn.callError(ctx, "inspect", err)
	}
	out := daemon.EncodeInspection(name, key, ins)
	if *asJSON {
		b, _ := json.Marshal(out)
		fmt.Fprintf(a.stdout, "%s\n", b)
		return nil
	}
	fmt.Fprintln(a.stdout, formatInspection(out))
	return nil
}

// formatInspection returns one line: "fresh", or the algorithm and its
// fields, then where the state is held.
func formatInspection(ins daemon.Inspection) string {
	var b strings.Builder
	if s := ins.State; s == nil {
		b.WriteString("fresh")
	} else {
		b.WriteString(s.Algorithm)
		field := func(name string, v any) {
			switch x := v.(type) {
			case float64:
				v = daemon.ReadableFloat(x)
			case daemon.Duration:
				v = time.Duration(x)
			}
			fmt.Fprintf(&b, " %s=%v", name, v)
		}
		switch {
		case s.Level != nil:
			field("level", *s.Level)
			field("level_at", s.LevelAt)
		case s.WindowHits != nil:
			field("window_start", s.WindowStart)
			field("window_hits", *s.WindowHits)
			if s.PrevWindowHits != nil {
				field("prev_window_hits", *s.PrevWindowHits)
			}
		case s.Interval != nil:
			field("tat", s.TAT)
			field("interval", *s.Interval)
		case s.LogEntries != nil:
			field("log_entries", *s.LogEntries)
			field("log_hits", *s.LogHits)
		}
		field("expire_at", s.ExpireAt)
	}
	fmt.Fprintf(&b, " owner=%s replicas=%s", ins.Owner, strings.Join(ins.Replicas, ","))
	if ins.WithoutOwner {
		b.WriteString(" without_owner=true")
	}
	return b.String()
}

// reset asks a daemon over gRPC to reset a key to fresh on its owner.
func (a *app) reset(ctx context.Context, args []string) error {
	cmd := a.keyCommand("reset", "Resets a key to fresh on its owner, which passes the reset on to the key's replicas. A destructive behavior: the node may refuse it (destructive_behaviors).")
	c, stop, err := cmd.start(args)
	if stop {
		return err
	}
	defer c.Close()
	owner, err := c.Reset(ctx, *cmd.name, *cmd.key)
	if err != nil {
		return cmd.conn.callError(ctx, "reset", err)
	}
	fmt.Fprintf(a.stdout, "reset owner=%s\n", owner)
	return nil
}

// keyCommand is a command about one key, over gRPC: its flags.
type keyCommand struct {
	app       *app
	cmd       string
	fs        *flag.FlagSet
	conn      *connFlags
	name, key *string
}

// keyCommand defines the flags of the command cmd, which about describes.
func (a *app) keyCommand(cmd, about string) *keyCommand {
	fs := flag.NewFlagSet("sluice "+cmd, flag.ContinueOnError)
	fs.SetOutput(a.stderr)
	k := &keyCommand{app: a, cmd: cmd, fs: fs, conn: addConnFlags(fs),
		name: fs.String("name", "", "limit name (required)"),
		key:  fs.String("key", "", "key the limit applies to (required)"),
	}
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: sluice %s --name N --key K [flags]\n\n%s\n\nFlags:\n", cmd, about)
		fs.PrintDefaults()
	}
	return k
}

// start parses args and connects to the node. stop says the command ends
// now, with err (nil after -h).
func (k *keyCommand) start(args []string) (c *client.Client, stop bool, err error) {
	if stop, err := parseFlags(k.fs, args, "name", "key"); stop {
		return nil, true, err
	}
	if c, err = k.conn.dial(k.app, k.cmd); err != nil {
		return nil, true, err
	}
	return c, false, nil
}
