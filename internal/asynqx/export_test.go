package asynqx

// WaitsForWork reports whether a dequeue of c is held waiting for work
// (waitForWork), for tests.
func (c *ServerClient) WaitsForWork() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.waiting
}
