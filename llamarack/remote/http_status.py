# Runs on the host (standard library only, imports nothing from llamarack; run by llamarack.remote.command).
"""Print the HTTP status of a GET of URL, or "none" when nothing answers.

    python3 -c SOURCE URL
"""

import sys
import urllib.error
import urllib.request

if __name__ == "__main__":
    try:
        with urllib.request.urlopen(sys.argv[1], timeout=5) as r:
            print(r.status)
    except urllib.error.HTTPError as e:
        print(e.code)
    except Exception:
        print("none")
