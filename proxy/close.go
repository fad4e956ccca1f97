package proxy

// Close closes the listener Listen opened, for a proxy that will never
// Run (its node failed to build after Listen). It does nothing once Run
// has been called: Run closes what it serves.
func (p *Proxy) Close() error {
	if p.started.Load() {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		return nil
	}
	err := p.ln.Close()
	p.ln = nil
	return err
}
