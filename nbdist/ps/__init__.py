"""The parameter server: wire format and update rules (the server itself arrives with NFDT)."""
