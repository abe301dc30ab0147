"""``lenserve bench``: replay a workload against several serving backends and compare them."""
