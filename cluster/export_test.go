package cluster

// SetProtocol makes a node built from c advertise the protocol versions
// min to max, standing in for a build that speaks them.
func SetProtocol(c *Config, min, max uint8) { c.protocol = protocolRange{min, max} }
