"""SillyTavern chats (.jsonl) import as one branch; swipes become sibling attempts."""

from __future__ import annotations

import json

import pytest

from stories import paths
from stories.bundles import BundleError, export_bytes, import_any, import_bundle
from stories.integrity import check_adventure
from stories.models import Adventure, Branch, Node
from stories.sillytavern import import_chat, looks_like_chat

pytestmark = pytest.mark.django_db


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create(username="alice")


def jsonl(*lines: dict) -> str:
    return "\n".join(json.dumps(line) for line in lines) + "\n"


HEADER = {"user_name": "Ash", "character_name": "Maren", "create_date": "2024-5-1 @10h", "chat_metadata": {}}


def char(text: str, swipes: list[str] | None = None, swipe_id: int | None = None, **extra) -> dict:
    message = {"name": "Maren", "is_user": False, "is_system": False, "send_date": "May 1, 2024", "mes": text}
    if swipes is not None:
        message["swipes"] = swipes
        message["swipe_id"] = swipe_id
    return {**message, **extra}


def you(text: str) -> dict:
    return {"name": "Ash", "is_user": True, "is_system": False, "mes": text}


def story(adventure: Adventure) -> list[tuple[int, str, str, str]]:
    head = Node.objects.get(pk=adventure.head_id)
    return [(n.depth, n.kind, n.player_input, n.narration) for n in paths.newest(head, 1000)]


def test_a_chat_with_swipes_imports_into_one_branch_with_sibling_attempts(user):
    text = jsonl(
        HEADER,
        char("The harbour is quiet.", ["The harbour is quiet.", "Gulls everywhere."], 0),
        you("I wave."),
        {"name": "System", "is_user": False, "is_system": True, "mes": "[Author's note]"},
        char("She waves back.", ["She ignores you.", "She waves back.", "She laughs."], 1, extra={"model": "mistral"}),
        you("Where is the ship?"),
        char("Gone.", ["Gone."], 0),
    )

    adventure = import_chat(text, owner=user, filename="Maren - 2024-5-1 @10h 03m.jsonl")

    assert check_adventure(adventure) == []
    assert Branch.objects.filter(adventure=adventure).count() == 1
    assert adventure.title == "Maren - 2024-5-1 @10h 03m"
    assert adventure.persona == "Ash"
    assert adventure.premise == "The harbour is quiet."
    assert story(adventure) == [
        (0, "opening", "", "The harbour is quiet."),
        (1, "story", "I wave.", "She waves back."),  # the system message is skipped
        (2, "story", "Where is the ship?", "Gone."),
    ]
    attempts = list(Node.objects.filter(adventure=adventure, depth=1).order_by("id"))
    assert [(a.narration, a.live, a.player_input) for a in attempts] == [
        ("She ignores you.", False, "I wave."),
        ("She waves back.", True, "I wave."),
        ("She laughs.", False, "I wave."),
    ]
    assert {a.parent_id for a in attempts} == {adventure.head.parent.parent_id}
    assert attempts[1].model_name == "mistral"
    openings = Node.objects.filter(adventure=adventure, depth=0).order_by("id")
    assert [(o.narration, o.live) for o in openings] == [("The harbour is quiet.", True), ("Gulls everywhere.", False)]
    # It is now an ordinary story: it exports and imports like any other.
    bundle = export_bytes(adventure)
    assert export_bytes(import_bundle(bundle, owner=user)) == bundle


def test_user_first_consecutive_replies_and_a_trailing_message(user):
    text = jsonl(you("Hello?"), char("Who's there?"), char("Silence."), you("Me."), you("Just me."))
    adventure = import_chat(text, owner=user)
    assert story(adventure) == [
        (0, "opening", "", ""),
        (1, "story", "Hello?", "Who's there?"),
        (2, "continue", "", "Silence."),
        (3, "story", "Me.\n\nJust me.", ""),
    ]
    assert adventure.title == "Imported chat"
    assert check_adventure(adventure) == []


def test_an_edited_reply_and_a_bad_swipe_id_keep_the_shown_text_live(user):
    text = jsonl(HEADER, char("Hi."), you("Go."), char("Edited reply.", ["Original reply.", "Other."], 0), you("?"))
    text += jsonl(char("Shown.", ["A.", "B."], 7))
    adventure = import_chat(text, owner=user)
    depth1 = Node.objects.filter(adventure=adventure, depth=1).order_by("id")
    assert [(n.narration, n.live) for n in depth1] == [("Edited reply.", True), ("Other.", False)]
    depth2 = Node.objects.filter(adventure=adventure, depth=2).order_by("id")
    assert [(n.narration, n.live) for n in depth2] == [("A.", False), ("B.", False), ("Shown.", True)]
    assert any("swipe_id" in w for w in adventure.import_warnings)
    assert adventure.title == "Chat with Maren"


def test_swipes_beyond_the_attempt_cap_are_dropped_keeping_the_shown_one(user, settings):
    settings.STORYTREE_MAX_ATTEMPTS_PER_COORDINATE = 3
    swipes = [f"Reply {i}." for i in range(6)]
    adventure = import_chat(jsonl(char("Hi."), you("Go."), char("Reply 5.", swipes, 5)), owner=user)
    depth1 = Node.objects.filter(adventure=adventure, depth=1).order_by("id")
    assert [(n.narration, n.live) for n in depth1] == [("Reply 0.", False), ("Reply 1.", False), ("Reply 5.", True)]
    assert any("dropped" in w for w in adventure.import_warnings)


def test_faults_name_the_line_and_write_nothing(user):
    before = Adventure.objects.count()
    cases = [
        (jsonl(HEADER, char("Hi."), {"name": "Ash", "is_user": "yes", "mes": "x"}), "$[2].is_user"),
        (jsonl(HEADER, char("Hi.", ["Hi.", 3], 0)), "$[1].swipes[1]"),
        (jsonl(HEADER, {"name": "Maren", "is_user": False}), "$[1].mes"),
        (jsonl(HEADER) + "{not json\n", "$[1]"),
        (jsonl(HEADER, char(7)), "$[1].mes"),
    ]
    for text, path in cases:
        with pytest.raises(BundleError) as caught:
            import_chat(text, owner=user)
        assert caught.value.status == 400
        assert caught.value.path == path, text
    assert Adventure.objects.count() == before


def test_import_any_detects_a_chat_by_name_or_by_content(user):
    text = jsonl(HEADER, char("Hi."), you("Go."), char("Went."))
    assert looks_like_chat(text)
    assert not looks_like_chat('{"format": "storytree-bundle", "version": 1,\n')
    by_name = import_any(text.encode(), owner=user, filename="chat.jsonl")
    by_content = import_any(text.encode(), owner=user)
    assert story(by_name) == story(by_content)
    assert len(story(by_content)) == 2
