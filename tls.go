package spillway

// TLSConfig configures TLS from a client to a broker. The Kafka and Redis
// brokers share it (kafkabroker.Config.TLS, redisbroker.Config.TLS), so
// its YAML and environment keys are the same under kafka.tls and
// redis.tls. Each broker states in its own documentation when TLS is on
// and which combinations of files it accepts.
type TLSConfig struct {
	// Enabled turns TLS on, verifying the server with the system roots
	// unless CAFile is set.
	Enabled bool `yaml:"enabled" env:"ENABLED"`
	// CAFile is a PEM bundle of the CAs trusted to sign the server's
	// certificate (replaces the system roots).
	CAFile string `yaml:"ca_file" env:"CA_FILE"`
	// CertFile is the PEM client certificate, for servers that require
	// one (mutual TLS).
	CertFile string `yaml:"cert_file" env:"CERT_FILE"`
	// KeyFile is the PEM private key of CertFile.
	KeyFile string `yaml:"key_file" env:"KEY_FILE"`
	// KeyPEM is the private key of CertFile inline, instead of KeyFile.
	KeyPEM Secret `yaml:"key_pem" env:"KEY_PEM"`
	// ServerName overrides the name verified in the server certificate
	// (default: the host being dialled).
	ServerName string `yaml:"server_name" env:"SERVER_NAME"`
	// InsecureSkipVerify disables server certificate verification. For
	// tests only.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify" env:"INSECURE_SKIP_VERIFY"`
}
