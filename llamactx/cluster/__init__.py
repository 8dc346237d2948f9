"""`llamactx serve --replicas N`: the server past one process, on Ray Serve (docs/scaling.md). Ray is an optional
extra (`pip install llamactx[cluster]`); nothing here is imported without --replicas.

    affinity.py   prefix keys of a rendered prompt and the table of which replica was sent which prefix (no Ray)
    forward.py    one HTTP request carried to a replica and run by the single-process server's app (no Ray)
    router.py     Ray Serve request routers: prefix affinity (default), round-robin
    replica.py    the engine deployment: one process, one model mmap, the single-process server's app
    ingress.py    the deployment behind Ray's HTTP proxy: renders, routes, forwards; /health and /metrics of all
    launch.py     the Serve application from `llamactx serve` flags; Ray started or joined (RAY_ADDRESS)
"""
