"""perfmodel: predict distributed training speed and memory before renting the cluster."""
