// Command keyway is a load-balancing HTTP ingress proxy for pipeline
// replica sets. Run `keyway help` for the commands.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// SIGUSR1 reopens the proxy's access log (log rotation, runProxy); any
	// other command must survive one too (`pkill -USR1 keyway` reaches
	// agents and demo replicas). Caught, not ignored: an ignored signal
	// would stay ignored in the processes an agent supervises.
	usr1 := make(chan os.Signal, 1)
	notifyReopen(usr1)
	go func() {
		for range usr1 {
		}
	}()
	// SIGUSR2 upgrades a proxy's binary (runProxy); the other commands
	// survive one, as SIGUSR1.
	usr2 := make(chan os.Signal, 1)
	notifyUpgrade(usr2)
	go func() {
		for range usr2 {
		}
	}()
	upgradesEnabled = true
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	if err == nil {
		return
	}
	fmt.Fprintln(os.Stderr, "keyway:", err)
	os.Exit(exitCode(err))
}
