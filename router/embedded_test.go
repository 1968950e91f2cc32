package router

import (
	"github.com/spillway-go/spillway/internal/embedreg"
	"github.com/spillway-go/spillway/internal/kafkatest"
)

// kafka.brokers "embedded" in these tests is a kfake broker in a process of
// its own (internal/kafkatest): the library never links one.
func init() { embedreg.RegisterKafka(kafkatest.Embedded) }
