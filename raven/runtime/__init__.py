"""How a Raven process runs: the service loop (signals, reload), the retry delay, the CPU's AES
flag, running without ``ssl``, handing freed heap back to the OS. (Nothing imported here: each
module is imported where it is used; ``without_ssl`` must run before asyncio is imported.)"""
