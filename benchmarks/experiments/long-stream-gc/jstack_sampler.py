"""Sample the driver JVM's stream execution thread every 2 s and append its stacks to a file
(usage: python jstack_sampler.py OUT; runs until the SparkSubmit JVM exits)."""

import os
import subprocess
import sys
import time


def main(path: str) -> None:
    pid = None
    while pid is None:
        found = subprocess.run(["pgrep", "-f", "org.apache.spark.deploy.SparkSubmit"], capture_output=True, text=True)
        pid = found.stdout.split()[0] if found.stdout.strip() else None
        if pid is None:
            time.sleep(1)
    with open(path, "a") as out:
        while os.path.exists(f"/proc/{pid}"):
            now = time.time()
            dump = subprocess.run(["jstack", pid], capture_output=True, text=True).stdout
            for block in dump.split("\n\n"):
                if "stream execution thread" in block:
                    out.write(f"=== {now:.1f}\n{block}\n")
            out.flush()
            time.sleep(2)


if __name__ == "__main__":
    main(sys.argv[1])
