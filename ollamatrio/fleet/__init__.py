"""A fleet of ollamatrio hosts behind one address: the routing policy and the gateway."""
