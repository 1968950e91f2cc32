package main

import "github.com/spillway-go/spillway/internal/promserve"

// serveMetrics serves /metrics on addr; see promserve.Serve.
func serveMetrics(addr string) (*promserve.Server, error) { return promserve.Serve(addr) }
