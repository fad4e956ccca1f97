package admin

// Close closes the listener Listen opened, for a server that will never
// Run (its node failed to build after Listen). Do not call it after Run:
// Run shuts the server down when its context ends.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	err := s.ln.Close()
	s.ln = nil
	return err
}
