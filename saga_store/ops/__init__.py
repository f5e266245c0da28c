"""Running it: connections, outages, metrics, durability checks, ACL users."""
