package router

import (
	"maps"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"golang.org/x/time/rate"
)

// Repeated error lines: a handler that fails the same way again and again
// (a message redelivered without end with retry.disabled, a broker that is
// down) logs errorBurst lines of one kind at once and then one every
// errorEvery; the next line it logs says how many were left out.
const (
	errorBurst = 10
	errorEvery = 10 * time.Second
)

// maxErrorKinds bounds the kinds remembered: past it they are forgotten
// and start afresh, so error messages that vary (an ID in the text) cannot
// grow the table without end.
const maxErrorKinds = 4096

// suppressedField is the log field that counts the lines of one kind left
// out since the last one logged.
const suppressedField = "suppressed"

// limitedLogger is the logger the router and Watermill's router log
// through: info, debug and trace lines pass unchanged, and error lines are
// limited per kind, a kind being the line's message and the handler it
// names (Watermill's handler_name field, or the router's handler field).
type limitedLogger struct {
	next   watermill.LoggerAdapter
	fields watermill.LogFields // what With added, to find the handler
	kinds  *errorKinds
}

type errorKinds struct {
	every time.Duration
	burst int
	mu    sync.Mutex
	kinds map[errorKind]*errorLimit
}

type errorKind struct{ msg, handler string }

type errorLimit struct {
	lim        *rate.Limiter
	suppressed int
}

func newLimitedLogger(next watermill.LoggerAdapter) watermill.LoggerAdapter {
	return limitedLogger{next: next, kinds: &errorKinds{every: errorEvery, burst: errorBurst, kinds: make(map[errorKind]*errorLimit)}}
}

func (l limitedLogger) Error(msg string, err error, fields watermill.LogFields) {
	kind := errorKind{msg: msg, handler: handlerOf(fields)}
	if kind.handler == "" {
		kind.handler = handlerOf(l.fields)
	}
	k := l.kinds
	k.mu.Lock()
	e := k.kinds[kind]
	if e == nil {
		if len(k.kinds) >= maxErrorKinds {
			clear(k.kinds)
		}
		e = &errorLimit{lim: rate.NewLimiter(rate.Every(k.every), k.burst)}
		k.kinds[kind] = e
	}
	if !e.lim.Allow() {
		e.suppressed++
		k.mu.Unlock()
		return
	}
	n := e.suppressed
	e.suppressed = 0
	k.mu.Unlock()
	if n > 0 {
		fields = maps.Clone(fields)
		if fields == nil {
			fields = watermill.LogFields{}
		}
		fields[suppressedField] = n
	}
	l.next.Error(msg, err, fields)
}

func handlerOf(fields watermill.LogFields) string {
	for _, k := range []string{"handler_name", "handler"} {
		if s, ok := fields[k].(string); ok {
			return s
		}
	}
	return ""
}

func (l limitedLogger) Info(msg string, fields watermill.LogFields)  { l.next.Info(msg, fields) }
func (l limitedLogger) Debug(msg string, fields watermill.LogFields) { l.next.Debug(msg, fields) }
func (l limitedLogger) Trace(msg string, fields watermill.LogFields) { l.next.Trace(msg, fields) }

func (l limitedLogger) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return limitedLogger{next: l.next.With(fields), fields: l.fields.Add(fields), kinds: l.kinds}
}
