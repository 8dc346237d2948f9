"""`llamactx serve --replicas N`: the server past one process, on Ray Serve (docs/scaling.md). Ray is an optional
extra (`pip install llamactx[cluster]`): nothing of Ray is imported without --replicas (options.py, which the
command line reads for its flags, imports no Ray).

    options.py    ClusterOptions: replicas, max replicas, target ongoing, routing; the cluster's defaults (no Ray)
    affinity.py   prefix keys of a rendered prompt or a held history, and the table of which replica holds which
                  prefix and how many histories (no Ray)
    forward.py    one HTTP request carried to a replica and run by the single-process server's app (no Ray)
    loopback.py   a local Ray that listens on 127.0.0.1 only, and each replica's gRPC server kept there
    router.py     Ray Serve request routers: prefix affinity (default), round-robin
    replica.py    the engine deployment: one process, one model mmap, the single-process server's app; reports
                  the histories it holds (routing stats)
    ingress.py    the deployment behind Ray's HTTP proxy: renders, routes, forwards; /health and /metrics of all
    launch.py     the Serve application from a ServerConfig and ClusterOptions; Ray started or joined (RAY_ADDRESS)

Nothing here imports the command line (cli/): cli/serve.py builds the config and the options and hands them down.
"""
