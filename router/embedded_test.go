package router

import (
	"github.com/spillway-go/spillway/internal/kafkatest"
	"github.com/spillway-go/spillway/kafkabroker"
)

// kafka.brokers "embedded" in these tests is a kfake broker in a process of
// its own (internal/kafkatest): the library never links one.
func init() { kafkabroker.RegisterEmbedded(kafkatest.Embedded) }
