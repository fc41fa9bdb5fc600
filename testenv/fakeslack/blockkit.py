"""Block Kit limits as Slack enforces them, as pure functions over the JSON a client sends.

Each check returns a list of error texts; an empty list means Slack would accept it.
A text names where the problem is (`blocks[3].text`, `view.title`) and what the limit
is, in Slack's own wording ("must be less than 3001 characters") plus what was found.
Slack reports a too-long text object at the object (`blocks[3].text`), not at its
`text` field, and so do we.

slack_sdk's block models check most of these in `to_dict()`, but not the per-field
length of section fields nor the 50-block limit of a message, and a bot that builds
blocks as plain dicts gets no check at all: hence a fake that refuses like Slack does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MESSAGE_BLOCKS = 50
VIEW_BLOCKS = 100  # modals and the Home tab
MESSAGE_TEXT = 40_000  # chat.postMessage `text`; beyond it Slack answers msg_too_long

SECTION_TEXT = 3000
SECTION_FIELDS = 10
SECTION_FIELD_TEXT = 2000
HEADER_TEXT = 150
CONTEXT_ELEMENTS = 10
ACTIONS_ELEMENTS = 25
BLOCK_ID = 255
ACTION_ID = 255
BUTTON_TEXT = 75
BUTTON_VALUE = 2000
URL = 3000
OPTION_TEXT = 75
OPTION_VALUE = 150
OPTION_DESCRIPTION = 75
SELECT_OPTIONS = 100
OVERFLOW_OPTIONS = 5
CHOICE_OPTIONS = 10  # checkboxes and radio buttons
PLACEHOLDER = 150
CONFIRM_TITLE = 100
CONFIRM_TEXT = 300
CONFIRM_BUTTON = 30
INPUT_LABEL = 2000
INPUT_HINT = 2000
IMAGE_ALT_TEXT = 2000
VIEW_TITLE = 24
VIEW_BUTTON = 24  # submit and close
PRIVATE_METADATA = 3000
CALLBACK_ID = 255
EXTERNAL_ID = 255

BLOCK_TYPES = frozenset(
    {
        "actions", "context", "divider", "file", "header", "image", "input", "markdown",
        "rich_text", "section", "video", "call", "table", "context_actions",
    }
)
TEXT_TYPES = frozenset({"plain_text", "mrkdwn"})
_SELECTS_WITH_OPTIONS = frozenset({"static_select", "multi_static_select"})
_CHOICES = frozenset({"checkboxes", "radio_buttons"})


def message_errors(
    *, blocks: Any = None, attachments: Any = None, where: str = ""
) -> list[str]:
    """Errors in the blocks of a message (chat.postMessage, chat.update, a response_url
    post), including blocks inside attachments."""
    errors: list[str] = []
    if blocks is not None:
        errors += blocks_errors(blocks, limit=MESSAGE_BLOCKS, where=f"{where}blocks")
    if attachments is not None:
        if not isinstance(attachments, list):
            return errors + [f"{where}attachments: must be an array"]
        for i, attachment in enumerate(attachments):
            if isinstance(attachment, dict) and "blocks" in attachment:
                errors += blocks_errors(
                    attachment["blocks"], limit=MESSAGE_BLOCKS,
                    where=f"{where}attachments[{i}].blocks",
                )
    return errors


def view_errors(view: Any, *, expected_type: str | None = None) -> list[str]:
    """Errors in a modal or Home tab view (views.open, views.update, views.publish)."""
    if not isinstance(view, dict):
        return ["view: must be an object"]
    errors: list[str] = []
    kind = view.get("type")
    if kind not in ("modal", "home"):
        errors.append(f"view.type: must be 'modal' or 'home' (got {kind!r})")
    elif expected_type is not None and kind != expected_type:
        errors.append(f"view.type: must be {expected_type!r} here (got {kind!r})")
    if kind == "modal":
        errors += _text_errors(view.get("title"), "view.title", VIEW_TITLE, plain_only=True)
    elif "title" in view:
        errors += _text_errors(view["title"], "view.title", VIEW_TITLE, plain_only=True)
    for name in ("submit", "close"):
        if name in view:
            errors += _text_errors(view[name], f"view.{name}", VIEW_BUTTON, plain_only=True)
    errors += _string_errors(view.get("private_metadata"), "view.private_metadata", PRIVATE_METADATA)
    errors += _string_errors(view.get("callback_id"), "view.callback_id", CALLBACK_ID)
    errors += _string_errors(view.get("external_id"), "view.external_id", EXTERNAL_ID)
    blocks = view.get("blocks")
    if blocks is None:
        errors.append("view.blocks: missing")
    else:
        errors += blocks_errors(blocks, limit=VIEW_BLOCKS, where="view.blocks")
        if (
            kind == "modal"
            and isinstance(blocks, list)
            and any(isinstance(b, dict) and b.get("type") == "input" for b in blocks)
            and "submit" not in view
        ):
            errors.append("view.submit: required when the view has an input block")
    return errors


def blocks_errors(blocks: Any, *, limit: int, where: str = "blocks") -> list[str]:
    if not isinstance(blocks, list):
        return [f"{where}: must be an array"]
    errors: list[str] = []
    if len(blocks) > limit:
        errors.append(f"{where}: block {limit + 1} exceeds the {limit}-block limit")
    seen_block_ids: set[str] = set()
    for i, block in enumerate(blocks):
        loc = f"{where}[{i}]"
        errors += block_errors(block, loc)
        if isinstance(block, dict) and isinstance(block.get("block_id"), str):
            if block["block_id"] in seen_block_ids:
                errors.append(f"{loc}.block_id: duplicate block_id {block['block_id']!r}")
            seen_block_ids.add(block["block_id"])
    return errors


def block_errors(block: Any, loc: str) -> list[str]:
    if not isinstance(block, dict):
        return [f"{loc}: must be an object"]
    kind = block.get("type")
    if kind not in BLOCK_TYPES:
        return [f"{loc}.type: unknown block type {kind!r}"]
    errors = _string_errors(block.get("block_id"), f"{loc}.block_id", BLOCK_ID)
    if kind == "section":
        if "text" not in block and "fields" not in block:
            errors.append(f"{loc}: a section needs `text` or `fields`")
        if "text" in block:
            errors += _text_errors(block["text"], f"{loc}.text", SECTION_TEXT)
        if "fields" in block:
            fields = block["fields"]
            errors += _count_errors(fields, f"{loc}.fields", SECTION_FIELDS)
            for j, field in enumerate(fields if isinstance(fields, list) else ()):
                errors += _text_errors(field, f"{loc}.fields[{j}]", SECTION_FIELD_TEXT)
        if "accessory" in block:
            errors += element_errors(block["accessory"], f"{loc}.accessory")
    elif kind == "header":
        errors += _text_errors(block.get("text"), f"{loc}.text", HEADER_TEXT, plain_only=True)
    elif kind == "context":
        elements = block.get("elements")
        errors += _count_errors(elements, f"{loc}.elements", CONTEXT_ELEMENTS, required=True)
        for j, element in enumerate(elements if isinstance(elements, list) else ()):
            eloc = f"{loc}.elements[{j}]"
            if isinstance(element, dict) and element.get("type") == "image":
                errors += _image_errors(element, eloc)
            else:
                errors += _text_errors(element, eloc, SECTION_TEXT)
    elif kind == "actions":
        elements = block.get("elements")
        errors += _count_errors(elements, f"{loc}.elements", ACTIONS_ELEMENTS, required=True)
        seen_action_ids: set[str] = set()
        for j, element in enumerate(elements if isinstance(elements, list) else ()):
            eloc = f"{loc}.elements[{j}]"
            errors += element_errors(element, eloc)
            action_id = element.get("action_id") if isinstance(element, dict) else None
            if isinstance(action_id, str):
                if action_id in seen_action_ids:
                    errors.append(f"{eloc}.action_id: duplicate action_id {action_id!r}")
                seen_action_ids.add(action_id)
    elif kind == "input":
        errors += _text_errors(block.get("label"), f"{loc}.label", INPUT_LABEL, plain_only=True)
        if "hint" in block:
            errors += _text_errors(block["hint"], f"{loc}.hint", INPUT_HINT, plain_only=True)
        if "element" not in block:
            errors.append(f"{loc}.element: missing")
        else:
            errors += element_errors(block["element"], f"{loc}.element")
    elif kind == "image":
        errors += _image_errors(block, loc)
    return errors


def element_errors(element: Any, loc: str) -> list[str]:
    """Errors in an interactive element (button, select, overflow, ...)."""
    if not isinstance(element, dict):
        return [f"{loc}: must be an object"]
    kind = element.get("type")
    if not isinstance(kind, str):
        return [f"{loc}.type: missing"]
    errors = _string_errors(element.get("action_id"), f"{loc}.action_id", ACTION_ID)
    if kind == "image":
        return _image_errors(element, loc)
    if kind == "button":
        errors += _text_errors(element.get("text"), f"{loc}.text", BUTTON_TEXT, plain_only=True)
        errors += _string_errors(element.get("value"), f"{loc}.value", BUTTON_VALUE)
        errors += _string_errors(element.get("url"), f"{loc}.url", URL)
        if element.get("style") not in (None, "primary", "danger"):
            errors.append(f"{loc}.style: must be 'primary' or 'danger'")
    if "placeholder" in element:
        errors += _text_errors(element["placeholder"], f"{loc}.placeholder", PLACEHOLDER, plain_only=True)
    if "confirm" in element:
        errors += confirm_errors(element["confirm"], f"{loc}.confirm")
    if "options" in element:
        limit = (
            OVERFLOW_OPTIONS if kind == "overflow"
            else CHOICE_OPTIONS if kind in _CHOICES
            else SELECT_OPTIONS
        )
        errors += _options_errors(element["options"], f"{loc}.options", limit)
    elif kind in _SELECTS_WITH_OPTIONS | _CHOICES | {"overflow"} and "option_groups" not in element:
        errors.append(f"{loc}.options: missing")
    if "option_groups" in element:
        groups = element["option_groups"]
        errors += _count_errors(groups, f"{loc}.option_groups", SELECT_OPTIONS)
        for g, group in enumerate(groups if isinstance(groups, list) else ()):
            gloc = f"{loc}.option_groups[{g}]"
            if not isinstance(group, dict):
                errors.append(f"{gloc}: must be an object")
                continue
            errors += _text_errors(group.get("label"), f"{gloc}.label", OPTION_TEXT, plain_only=True)
            errors += _options_errors(group.get("options"), f"{gloc}.options", SELECT_OPTIONS)
    if "initial_option" in element:
        errors += option_errors(element["initial_option"], f"{loc}.initial_option")
    if "initial_options" in element:
        initial = element["initial_options"]
        if not isinstance(initial, list):
            errors.append(f"{loc}.initial_options: must be an array")
        else:
            for j, option in enumerate(initial):
                errors += option_errors(option, f"{loc}.initial_options[{j}]")
    return errors


def option_errors(option: Any, loc: str) -> list[str]:
    if not isinstance(option, dict):
        return [f"{loc}: must be an object"]
    errors = _text_errors(option.get("text"), f"{loc}.text", OPTION_TEXT)
    if "value" not in option:
        errors.append(f"{loc}.value: missing")
    errors += _string_errors(option.get("value"), f"{loc}.value", OPTION_VALUE)
    if "description" in option:
        errors += _text_errors(option["description"], f"{loc}.description", OPTION_DESCRIPTION)
    errors += _string_errors(option.get("url"), f"{loc}.url", URL)
    return errors


def confirm_errors(confirm: Any, loc: str) -> list[str]:
    if not isinstance(confirm, dict):
        return [f"{loc}: must be an object"]
    errors = _text_errors(confirm.get("title"), f"{loc}.title", CONFIRM_TITLE, plain_only=True)
    errors += _text_errors(confirm.get("text"), f"{loc}.text", CONFIRM_TEXT)
    errors += _text_errors(confirm.get("confirm"), f"{loc}.confirm", CONFIRM_BUTTON, plain_only=True)
    errors += _text_errors(confirm.get("deny"), f"{loc}.deny", CONFIRM_BUTTON, plain_only=True)
    return errors


def _options_errors(options: Any, loc: str, limit: int) -> list[str]:
    errors = _count_errors(options, loc, limit, required=True)
    for j, option in enumerate(options if isinstance(options, list) else ()):
        errors += option_errors(option, f"{loc}[{j}]")
    return errors


def _image_errors(image: dict[str, Any], loc: str) -> list[str]:
    errors: list[str] = []
    if "image_url" not in image and "slack_file" not in image:
        errors.append(f"{loc}.image_url: missing")
    errors += _string_errors(image.get("image_url"), f"{loc}.image_url", URL)
    if "alt_text" not in image:
        errors.append(f"{loc}.alt_text: missing")
    errors += _string_errors(image.get("alt_text"), f"{loc}.alt_text", IMAGE_ALT_TEXT)
    return errors


def _text_errors(obj: Any, loc: str, limit: int, *, plain_only: bool = False) -> list[str]:
    if obj is None:
        return [f"{loc}: missing"]
    if not isinstance(obj, dict):
        return [f"{loc}: must be a text object"]
    kind = obj.get("type")
    allowed: Sequence[str] = ("plain_text",) if plain_only else ("plain_text", "mrkdwn")
    if kind not in allowed:
        return [f"{loc}.type: must be {' or '.join(repr(a) for a in allowed)} (got {kind!r})"]
    text = obj.get("text")
    if not isinstance(text, str):
        return [f"{loc}.text: must be a string"]
    if not text:
        return [f"{loc}: must be more than 0 characters"]
    if len(text) > limit:
        return [f"{loc}: must be less than {limit + 1} characters (got {len(text)})"]
    return []


def _string_errors(value: Any, loc: str, limit: int) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, str):
        return [f"{loc}: must be a string"]
    if len(value) > limit:
        return [f"{loc}: must be less than {limit + 1} characters (got {len(value)})"]
    return []


def _count_errors(items: Any, loc: str, limit: int, *, required: bool = False) -> list[str]:
    if items is None:
        return [f"{loc}: missing"] if required else []
    if not isinstance(items, list):
        return [f"{loc}: must be an array"]
    if required and not items:
        return [f"{loc}: must have at least 1 item"]
    if len(items) > limit:
        return [f"{loc}: must have no more than {limit} items (got {len(items)})"]
    return []
