"""Sample the driver JVM's stream execution thread every 2 s; append stacks to a file."""
import subprocess, time, sys, re, os
out = open(sys.argv[1], "a")
pid = None
while pid is None:
    r = subprocess.run(["pgrep", "-f", "org.apache.spark.deploy.SparkSubmit"], capture_output=True, text=True)
    if r.stdout.strip():
        pid = r.stdout.split()[0]
    else:
        time.sleep(1)
while os.path.exists(f"/proc/{pid}"):
    t = time.time()
    r = subprocess.run(["jstack", pid], capture_output=True, text=True)
    blocks = r.stdout.split("\n\n")
    for b in blocks:
        if "stream execution thread" in b:
            out.write(f"=== {t:.1f}\n{b}\n")
    out.flush()
    time.sleep(2)
