"""The front door and its transports: QueueService (the only way in), TCP, HTTP, legacy Queick clients."""
