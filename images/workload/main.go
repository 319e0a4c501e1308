// Command workload stands in for a training container: it runs for a given time, printing
// a line per second, and exits with a given code. A SIGTERM ends it early with exit code
// 143, as a shell's default handler would.
//
//	workload --run-for 30s --exit-code 1
//
// The flags default to the environment variables RUN_FOR and EXIT_CODE, so a runtime's
// container env can set them without touching its command.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

func main() {
	runFor := flag.Duration("run-for", envDuration("RUN_FOR", 3*time.Second), "how long to run")
	exitCode := flag.Int("exit-code", envInt("EXIT_CODE", 0), "exit code once the time is up")
	flag.Parse()

	host, _ := os.Hostname()
	fmt.Printf("workload on %s: running for %s, then exiting %d\n", host, *runFor, *exitCode)
	terminated := make(chan os.Signal, 1)
	signal.Notify(terminated, syscall.SIGTERM, syscall.SIGINT)
	// Taken before the timer is set, so that the time it reports is never short of --run-for
	// (a loaded machine can stall the goroutine between the two).
	started := time.Now()
	done := time.After(*runFor)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-done:
			fmt.Printf("done after %s, exit code %d\n", time.Since(started).Round(time.Millisecond), *exitCode)
			os.Exit(*exitCode)
		case sig := <-terminated:
			fmt.Printf("%s after %s\n", sig, time.Since(started).Round(time.Millisecond))
			os.Exit(143)
		case <-tick.C:
			fmt.Printf("step %d\n", int(time.Since(started).Seconds()))
		}
	}
}

func envDuration(name string, fallback time.Duration) time.Duration {
	if value, err := time.ParseDuration(os.Getenv(name)); err == nil {
		return value
	}
	return fallback
}

func envInt(name string, fallback int) int {
	if value, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return value
	}
	return fallback
}
