"""The NFC attendance terminal: card taps → durable punches → Slack, through queickd.

  punchlog.py   the attendance log (SQLite): registry, punches, toggle, debounce
  readers.py    nfcpy and line readers, and the loop that reopens them
  terminal.py   the terminal process: reader → log → feedback → daemon
  slack.py      the post jobs the daemon runs, and how Slack's answers map to retries
  message.py    message and report text
  feedback.py   the beep/LED command
  cli.py        `queick attendance`

Extras: `nfc` (nfcpy, pyserial) for readers, `slack` (slack-sdk) for the post jobs.
Nothing here is imported by the daemon's core.
"""
