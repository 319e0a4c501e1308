// pause is the sandbox ("infra") container of every pod on a kind node: it holds the pod's
// namespaces and does nothing else. Kubernetes' own pause (build/pause) is a small C program
// compiled in a container image this machine cannot pull; this is the same behaviour in Go,
// built statically: exit 0 on SIGINT/SIGTERM, reap children when it is the pod's PID 1
// (shared process namespace), otherwise sleep.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// version names the upstream release whose behaviour this reproduces.
const version = "3.10.1"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Printf("pause.go version: %s\n", version)
		return
	}
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "Warning: pause should be the first process")
	}
	signals := make(chan os.Signal, 16)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for received := range signals {
		if received != syscall.SIGCHLD {
			fmt.Fprintf(os.Stderr, "Shutting down, got signal: %v\n", received)
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
