"""Slack's `:name:` emoji codes as the characters Teams shows.

Teams shows a code such as `:warning:` in a bot's message as those letters (Adaptive Cards do not translate them
either: microsoft/AdaptiveCards#4777), so the codes our own messages use, and the ones people use most, become the
emoji itself. A code not listed stays as written."""

from __future__ import annotations

import re

CODES: dict[str, str] = {
    # Ours (escalation/views.py, bot/settings.py's reactions).
    "alarm_clock": "⏰",
    "large_blue_circle": "🔵",
    "large_orange_circle": "🟠",
    "robot_face": "🤖",
    "rotating_light": "🚨",
    "warning": "⚠️",
    "white_check_mark": "✅",
    "eyes": "👀",
    "memo": "📝",
    "hourglass_flowing_sand": "⏳",
    # What customers and colleagues write most.
    "+1": "👍",
    "thumbsup": "👍",
    "-1": "👎",
    "thumbsdown": "👎",
    "smile": "😄",
    "slightly_smiling_face": "🙂",
    "grinning": "😀",
    "joy": "😂",
    "wink": "😉",
    "heart": "❤️",
    "pray": "🙏",
    "tada": "🎉",
    "wave": "👋",
    "clap": "👏",
    "fire": "🔥",
    "rocket": "🚀",
    "x": "❌",
    "heavy_check_mark": "✔️",
    "question": "❓",
    "exclamation": "❗",
    "thinking_face": "🤔",
    "cry": "😢",
    "disappointed": "😞",
    "angry": "😠",
    "ok_hand": "👌",
    "package": "📦",
    "truck": "🚚",
    "moneybag": "💰",
    "credit_card": "💳",
}
_CODE = re.compile(r":([a-z0-9_+-]+):")


def emojize(text: str) -> str:
    """`text` with every known `:name:` code replaced by its emoji."""
    return _CODE.sub(lambda m: CODES.get(m[1], m[0]), text)
