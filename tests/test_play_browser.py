"""The play page in Chromium against a live server: streaming turns, the attempt pager,
forks and the branch rail, undo/redo, branch deletion, scroll anchoring on a 600-node
story, a stale second tab, the keyboard alone and a 390 px phone viewport.

Turns run eagerly inside the POST (Celery's always-eager mode) except in the streaming
test, which starts a real worker so narration can be seen arriving before the commit."""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from playwright.sync_api import Page, expect

from stories import tree
from stories.models import Adventure, Node
from stories.synthetic import build_story

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def player(page: Page, live_server, client, user):
    """The page, signed in as alice (the session cookie of a forced login)."""
    client.force_login(user)
    cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
    page.context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": cookie, "url": live_server.url}])
    return page


def play_url(live_server, adventure: Adventure) -> str:
    return f"{live_server.url}/adventures/{adventure.pk}/"


def send(page: Page, text: str) -> None:
    page.fill("#composer-text", text)
    page.press("#composer-text", "Enter")


def node(page: Page, depth: int):
    return page.locator(f"#story .node[data-depth='{depth}']")


def current_branch(page: Page):
    return page.locator("#rail .branch[aria-current='true'] .branch-label")


def normalized(text: str) -> str:
    return " ".join(text.split())


def plain_node(adventure: Adventure, text: str, **extra) -> dict:
    """Content for a node written straight through the tree (no model), for setting scenes up."""
    head = Node.objects.get(pk=Adventure.objects.get(pk=adventure.pk).head_id)
    return {
        "kind": "do",
        "player_input": text,
        "narration": f"You {text.lower()}.",
        "suggestions": [],
        "state_delta": [],
        "state_after": head.state_after,
        "checks": [],
        **extra,
    }


@pytest.mark.worker
def test_three_turns_stream_in_before_the_commit_replaces_them(player, live_server, user, start_worker):
    start_worker(STORYTREE_BUILTIN_CHUNK_DELAY_MS="200")
    adventure = tree.adventure_create(
        owner=user, title="Harbour", premise="Fog over the harbour.", persona="Ilsa, a navigator with a steady hand."
    )
    player.goto(play_url(live_server, adventure))
    for depth, text in enumerate(["I look at the harbour.", "I walk to the pier.", "I listen to the gulls."], start=1):
        send(player, text)
        # The pending turn shows narration while its job is still running: #job-progress exists
        # only until the job ends, and it holds the streamed text in an aria-live region.
        streamed = player.locator("#job-progress .streamed")
        expect(player.locator("#job-progress")).to_have_attribute("aria-live", "polite")
        player.wait_for_function(
            "() => { const s = document.querySelector('#job-progress .streamed'); return s && s.textContent.trim(); }",
            timeout=10_000,
        )
        seen = normalized(streamed.inner_text())
        assert seen
        # Then the committed node replaces the pending one.
        expect(node(player, depth)).to_be_visible(timeout=10_000)
        expect(player.locator("#job-progress")).to_have_count(0)
        committed = Node.objects.get(adventure=adventure, depth=depth, live=True)
        assert normalized(committed.narration).startswith(seen)
        expect(node(player, depth).locator(".narration")).to_contain_text(committed.narration.split(".")[0])
        expect(player.locator(".story-head .length")).to_have_text(f"{depth} turn{'s' if depth > 1 else ''}")
    assert Adventure.objects.get(pk=adventure.pk).head.depth == 3


def test_retry_page_attempts_fork_and_switch_branches(player, live_server, user, redis_url):
    adventure = tree.adventure_create(owner=user, title="Lantern", premise="A dark inn by the sea.")
    player.goto(play_url(live_server, adventure))
    send(player, "I take the lantern")
    expect(node(player, 1)).to_be_visible()
    expect(player.locator("#state .inventory")).to_contain_text("lantern")

    node(player, 1).locator("button.retry").click()
    pager = node(player, 1).locator(".pager-pos")
    expect(pager).to_have_text("2/2")
    node(player, 1).locator("button.pager-prev").click()
    expect(pager).to_have_text("1/2")
    first, second = Node.objects.filter(adventure=adventure, depth=1).order_by("id")
    assert Adventure.objects.get(pk=adventure.pk).head_id == first.pk
    node(player, 1).locator("button.pager-next").click()
    expect(pager).to_have_text("2/2")
    assert Adventure.objects.get(pk=adventure.pk).head_id == second.pk

    # Fork from the first attempt: it gets a branch of its own and the head moves onto it.
    node(player, 1).locator("details.attempts summary").click()
    node(player, 1).locator(f".attempt[data-attempt='{first.pk}'] button.fork").click()
    expect(player.locator("#rail .branch")).to_have_count(2)
    expect(current_branch(player)).to_have_text("Fork at turn 1")
    assert Adventure.objects.get(pk=adventure.pk).head_id == first.pk

    send(player, "I take the rope")
    expect(node(player, 2)).to_be_visible()
    expect(player.locator("#state .inventory")).to_contain_text("rope")
    expect(player.locator("#context .verbatim-range")).to_contain_text("Turns 0–2")

    # Switching back: the story, the state panel and the context panel all follow the head,
    # although nothing about the switch changes the number of turns shown by much.
    main = player.locator("#rail .branch", has_text="Main story")
    main.locator("button.switch").click()
    expect(current_branch(player)).to_have_text("Main story")
    expect(node(player, 2)).to_have_count(0)
    expect(node(player, 1)).to_have_attribute("data-node", str(second.pk))
    expect(player.locator("#state .inventory")).not_to_contain_text("rope")
    expect(player.locator("#state .inventory")).to_contain_text("lantern")
    expect(player.locator("#context .verbatim-range")).to_contain_text("Turns 0–1")


def test_undo_redo_and_deleting_a_branch_that_is_not_read(player, live_server, user):
    adventure = tree.adventure_create(owner=user, title="Cellar", premise="Steps lead down.")
    tree.node_append(adventure=adventure, expected_version=None, **plain_node(adventure, "Go down"))
    second = tree.node_append(adventure=adventure, expected_version=None, **plain_node(adventure, "Open the door"))
    # A branch beside turn 2 and one forked from it in turn: deleting the first takes both.
    tree.sibling_branch_add(adventure=adventure, target=second, expected_version=None, **plain_node(adventure, "Knock"))
    knock_tip = tree.node_append(adventure=adventure, expected_version=None, **plain_node(adventure, "Wait"))
    tree.sibling_branch_add(
        adventure=adventure, target=knock_tip, expected_version=None, **plain_node(adventure, "Shout")
    )
    main = second.branch
    tree.branch_switch(adventure=adventure, branch=main, expected_version=None)

    player.goto(play_url(live_server, adventure))
    expect(player.locator("#rail .branch")).to_have_count(3)
    expect(current_branch(player)).to_have_text("Main story")
    # The branch being read offers no delete; the others do.
    expect(player.locator("#rail .branch[aria-current='true'] a", has_text="Delete")).to_have_count(0)
    expect(player.locator("#rail .branch:not([aria-current]) a", has_text="Delete")).to_have_count(2)

    # Undo with the keyboard shortcut, redo with the button.
    player.locator("#story-title").click()
    player.keyboard.press("Alt+z")
    expect(node(player, 2)).to_have_count(0)
    expect(player.locator("#redo-button")).to_be_enabled()
    player.locator("#redo-button").click()
    expect(node(player, 2)).to_be_visible()
    expect(node(player, 2)).to_have_attribute("data-node", str(second.pk))

    knock = player.locator("#rail .branch", has_text="Fork at turn 2")
    knock.locator("a", has_text="Delete").click()
    expect(player.locator("h1")).to_have_text("Delete “Fork at turn 2”?")
    expect(player.locator(".descendants")).to_have_text(re.compile("Fork at turn 3"))
    player.locator("#confirm-delete").click()
    player.wait_for_url(play_url(live_server, adventure))
    expect(player.locator(".messages")).to_contain_text("Deleted “Fork at turn 2” and 1 branch forked from it")
    expect(player.locator("#rail .branch")).to_have_count(1)
    assert adventure.branches.count() == 1


def test_scrolling_up_a_600_node_story_keeps_the_top_turn_in_place(player, live_server, user):
    adventure = build_story(nodes=600, forks=0, bytes_per_node=300, owner=user)
    player.set_viewport_size({"width": 1280, "height": 800})
    player.goto(play_url(live_server, adventure))
    expect(player.locator("#story .node")).to_have_count(30)
    expect(node(player, 599)).to_be_in_viewport()
    for loaded in (60, 90, 120):
        # Scroll to the top and, in the same task (before any observer can fire), note the
        # turn at the top of the view and where it is.
        before = player.evaluate(
            """() => {
                window.scrollTo(0, 0);
                const first = [...document.querySelectorAll('#story .node')].find(n => n.getBoundingClientRect().bottom > 0);
                return {depth: first.dataset.depth, top: first.getBoundingClientRect().top};
            }"""
        )
        expect(player.locator("#story .node")).to_have_count(loaded)
        player.wait_for_timeout(100)  # let the swap settle
        after = player.evaluate(
            "(depth) => document.querySelector(`#story .node[data-depth='${depth}']`).getBoundingClientRect().top",
            before["depth"],
        )
        assert abs(after - before["top"]) <= 20, (before, after)
        # The earlier page went above the view: the next sentinel is not loading by itself.
        assert player.evaluate("() => window.scrollY") > 1000
    depths = player.evaluate("() => [...document.querySelectorAll('#story .node')].map(n => +n.dataset.depth)")
    assert depths == list(range(480, 600))


def test_a_turn_from_a_stale_tab_says_so_and_recovers(player, live_server, user, redis_url):
    adventure = tree.adventure_create(owner=user, title="Two tabs", premise="A quiet room.")
    first = player
    second = player.context.new_page()
    first.goto(play_url(live_server, adventure))
    second.goto(play_url(live_server, adventure))

    send(second, "I open the window")
    expect(node(second, 1)).to_be_visible()

    send(first, "I close the door")
    notice = first.locator("#notice")
    expect(notice).to_contain_text("This story moved on in another tab")
    expect(node(first, 1)).to_have_count(0)
    assert Node.objects.filter(adventure=adventure).count() == 2  # nothing written by the stale tab

    first.locator("#reload-head").click()
    expect(node(first, 1).locator(".input-text")).to_have_text("I open the window")
    expect(notice).to_be_empty()
    send(first, "I close the door")
    expect(node(first, 2).locator(".input-text")).to_have_text("I close the door")
    second.close()


def test_keyboard_alone_on_a_phone(player, live_server, user, redis_url):
    adventure = tree.adventure_create(owner=user, title="Phone", premise="A narrow street.")
    player.set_viewport_size({"width": 390, "height": 844})
    player.goto(play_url(live_server, adventure))

    for _ in range(40):
        if player.evaluate("() => document.activeElement && document.activeElement.id") == "composer-text":
            break
        player.keyboard.press("Tab")
    else:
        pytest.fail("Tab never reached the composer")
    player.keyboard.type("I look around")
    player.keyboard.press("Shift+Enter")
    player.keyboard.type("carefully")
    assert player.input_value("#composer-text") == "I look around\ncarefully"
    player.keyboard.press("Enter")
    expect(node(player, 1)).to_be_visible()

    # Alt+Z is a shortcut only when not typing: in the composer it does nothing.
    player.locator("#composer-text").focus()
    player.keyboard.press("Alt+z")
    player.wait_for_timeout(300)
    expect(node(player, 1)).to_be_visible()
    player.keyboard.press("Shift+Tab")
    player.keyboard.press("Alt+z")
    expect(node(player, 1)).to_have_count(0)

    # Panels stack below the story, and nothing is wider than the phone.
    layout = player.evaluate(
        """() => ({
            width: document.documentElement.scrollWidth,
            storyBottom: document.querySelector('.story-col').getBoundingClientRect().bottom,
            sideTop: document.querySelector('#side').getBoundingClientRect().top,
        })"""
    )
    assert layout["width"] <= 390
    assert layout["sideTop"] >= layout["storyBottom"]


def test_a_failed_turn_says_why_and_retry_writes_it(player, live_server, user, redis_url, fake_openai):
    adventure = tree.adventure_create(
        owner=user, title="Remote", premise="A keep on a hill.", model_profile=fake_openai.profile()
    )
    fake_openai.add_error(500)
    player.goto(play_url(live_server, adventure))
    send(player, "I knock on the gate")
    ended = player.locator("#job .job-ended")
    expect(ended).to_contain_text("This turn could not be written.")
    expect(ended).to_have_attribute("role", "alert")
    assert "model" in ended.inner_text().lower()
    # The words come back to the composer, and nothing was written.
    expect(player.locator("#composer-text")).to_have_value("I knock on the gate")
    assert Node.objects.filter(adventure=adventure).count() == 1

    player.locator("#job-retry").click()
    expect(node(player, 1).locator(".narration")).to_contain_text("The lantern gutters")
    expect(player.locator("#job .job-ended")).to_have_count(0)


@pytest.mark.worker
def test_cancel_a_turn_while_it_streams_then_retry_it(player, live_server, user, start_worker):
    start_worker(STORYTREE_BUILTIN_CHUNK_DELAY_MS="250")
    adventure = tree.adventure_create(owner=user, title="Slow", premise="A long road.", persona="A patient walker.")
    player.goto(play_url(live_server, adventure))
    # A long action makes a long narration (a dozen streamed pieces, 250 ms apart): time to cancel.
    action = "I walk on slowly along the old road, counting the milestones one by one"
    send(player, action)
    player.wait_for_function(
        "() => { const s = document.querySelector('#job-progress .streamed'); return s && s.textContent.trim(); }",
        timeout=10_000,
    )
    expect(player.locator("#job-progress .stage")).to_contain_text("Narrating")
    player.locator("#job-cancel").click()
    expect(player.locator("#job .job-ended")).to_contain_text("Cancelled.", timeout=10_000)
    assert Node.objects.filter(adventure=adventure).count() == 1

    player.locator("#job-retry").click()
    expect(node(player, 1)).to_be_visible(timeout=15_000)
    expect(node(player, 1).locator(".input-text")).to_have_text(action)


def test_edit_an_input_regenerate_and_the_side_panels(player, live_server, user, redis_url):
    adventure = tree.adventure_create(owner=user, title="Panels", premise="A market square.")
    player.goto(play_url(live_server, adventure))
    send(player, "I take the apple")
    expect(node(player, 1)).to_be_visible()

    # Edit my input: the form opens inside the turn; sending it writes a new branch.
    node(player, 1).locator("a.edit").click()
    box = node(player, 1).locator(".edit-form textarea")
    expect(box).to_be_focused()
    box.fill("I take the pear")
    node(player, 1).locator(".edit-form button[type=submit]").click()
    expect(node(player, 1).locator(".input-text")).to_have_text("I take the pear")
    expect(player.locator("#rail .branch")).to_have_count(2)
    expect(current_branch(player)).to_have_text("Fork at turn 1")
    expect(player.locator("#state .inventory")).to_contain_text("pear")

    # Regenerate: the same action on another new branch.
    node(player, 1).locator("button.regenerate").click()
    expect(player.locator("#rail .branch")).to_have_count(3)
    expect(node(player, 1).locator(".input-text")).to_have_text("I take the pear")

    # Memories on this path: add, pin, delete.
    player.fill("#memory-text", "The baker owes me a favour.")
    player.locator("#memories button", has_text="Add memory").click()
    memory = player.locator("#memories .memory", has_text="The baker owes me a favour.")
    expect(memory).to_be_visible()
    memory.locator("button", has_text="Pin").click()
    expect(player.locator("#memories .memory.pinned")).to_contain_text("The baker owes me a favour.")
    player.locator("#memories .memory.pinned button", has_text="Delete").click()
    expect(player.locator("#memories .memory")).to_have_count(0)
    # A blank memory is refused in plain words.
    player.locator("#memory-text").evaluate("el => el.removeAttribute('required')")
    player.fill("#memory-text", "   ")
    player.locator("#memories button", has_text="Add memory").click()
    expect(player.locator("#notice")).to_contain_text("A memory can't be blank.")

    # World book: add, disable, edit.
    player.locator("#world details.add-entry summary").click()
    player.fill("#world-new-keys", "baker, bread")
    player.fill("#world-new-content", "The baker is the mayor's cousin.")
    player.locator("#world button", has_text="Add entry").click()
    entry = player.locator("#world .entry", has_text="The baker is the mayor's cousin.")
    expect(entry.locator(".entry-keys")).to_contain_text("baker, bread")
    entry.locator("button", has_text="Disable").click()
    expect(player.locator("#world .entry.disabled")).to_have_count(1)
    entry = player.locator("#world .entry")
    entry.locator("details.edit-entry summary").click()
    entry.locator("textarea[name=content]").fill("The baker is the mayor's sister.")
    entry.locator("input[type=checkbox][name=enabled]").check()
    entry.locator("button", has_text="Save entry").click()
    expect(player.locator("#world .entry:not(.disabled) .entry-content")).to_have_text(
        "The baker is the mayor's sister."
    )
