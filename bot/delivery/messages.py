"""Each delivery as its messenger's calls: where a new message goes and what it shows (rendered when it is sent, so
a case shows its state as it is then), and the calls that change a message that exists."""

from __future__ import annotations

from typing import assert_never

from agents.attachments import FileRef
from agents.db.deliveries import (
    AddReaction,
    Answer,
    CasePost,
    CaseUpdate,
    Change,
    CsatAsk,
    Delivery,
    Erase,
    FilesToCustomer,
    FilesToStaff,
    NewMessage,
    Post,
    RelayDelete,
    RelayEdit,
    RelayToCustomer,
    RelayToStaff,
    Reminder,
    RemoveReaction,
    StaffNotice,
    Typing,
)
from agents.language import Language
from agents.texts import Texts
from bot.answers import answer_message
from bot.channels.messenger import FileFetcher, FileSharing, Messenger, Refused, Where
from bot.csat import csat_question
from bot.delivery.ledger import Ledger
from escalation.render import CaseRenderer
from escalation.views import Message, relay_text

FILES_NOT_SHARED = "files are relayed only between Slack threads"
"""Why a file relay to or from a channel without file shares carries the files' names only."""


class Undeliverable(Exception):
    """A row that cannot be sent however often it is tried (an unknown kind, a case thread that was never posted)."""


class Messages:
    def __init__(
        self,
        *,
        ledger: Ledger,
        cases: CaseRenderer | None,
        files: FileFetcher | None,
        feedback_buttons: bool,
        texts: Texts,
    ) -> None:
        self.ledger = ledger
        self.cases = cases
        """Renders the staff side's messages; None where no escalation deliveries are sent (they are given up)."""
        self.files = files
        """Fetches the files that file relays share again; None: only their names go."""
        self.feedback_buttons = feedback_buttons
        """👍/👎 under each AI answer (`bot.answers.feedback_buttons`)."""
        self.texts = texts
        """The words an answer carries besides the model's (its sources line, the buttons' labels)."""

    def renderer(self) -> CaseRenderer:
        if self.cases is None:
            raise Undeliverable("no case renderer configured")
        return self.cases

    def not_shared(self, ref: FileRef) -> str:
        """Why a file of a file relay goes as its name only."""
        if self.files is not None and self.files.too_big(ref):
            return f"larger than {self.files.max_bytes / 1_000_000:g} MB"
        return FILES_NOT_SHARED

    async def target(self, delivery: Delivery) -> Delivery:
        """The delivery whose side (the customer's or the staff channel's) the calls go to: an erase's is that of
        the post it erases."""
        if isinstance(delivery, Erase) and delivery.erases is not None:
            post = await self.ledger.post_of(delivery.erases)
            if post is None:
                raise Undeliverable(f"outbox row {delivery.erases} holds no post")
            return post[0]
        return delivery

    async def where(self, delivery: NewMessage) -> Where:
        match delivery:
            case (
                Post(channel=channel, thread=thread)
                | Answer(channel=channel, thread=thread)
                | RelayToCustomer(channel=channel, thread=thread)
                | CsatAsk(channel=channel, thread=thread)
                | FilesToCustomer(channel=channel, thread=thread)
            ):
                return Where(channel, thread)
            case CasePost(channel=channel):
                return Where(channel, None)
            case (
                RelayToStaff(escalation_id=escalation_id)
                | FilesToStaff(escalation_id=escalation_id)
                | Reminder(escalation_id=escalation_id)
            ):
                # The case's thread: known once the case message is out, which it always is by now (it was queued
                # earlier in the same conversation).
                where = await self.renderer().case_thread(escalation_id)
                if where is None:
                    raise Undeliverable(f"case {escalation_id} has no thread")
                return Where(*where)

    async def render(self, delivery: NewMessage, language: Language | None = None) -> Message | None:
        """What `delivery` shows; `language` is its conversation's, for the bot's own words around an answer."""
        match delivery:
            case Post(text=text, answer=answer, sources=sources):
                return Message(text, native=True, ai=answer, sources=sources)
            case Answer(text=markdown, sources=sources):
                return answer_message(
                    markdown, feedback=self.feedback_buttons, sources=sources, texts=self.texts, language=language
                )
            case CasePost(escalation_id=escalation_id):
                return await self.renderer().case(escalation_id)
            case RelayToStaff():
                return await self.renderer().relay_to_staff(delivery)
            case RelayToCustomer():
                return await self.renderer().relay_to_customer(delivery)
            case Reminder():
                return self.renderer().reminder(delivery)
            case CsatAsk(escalation_id=escalation_id, text=question):
                return csat_question(escalation_id, question)
            case FilesToStaff() | FilesToCustomer():
                return await self.renderer().files_as_text(delivery, why=self.not_shared)

    async def change(self, delivery: Change, messenger: Messenger) -> None:
        """Act on a message that exists; safe to repeat, so no attempt is recorded first."""
        match delivery:
            case AddReaction(channel=channel, message=ts, name=name):
                await messenger.react(channel, ts, name, add=True)
            case RemoveReaction(channel=channel, message=ts, name=name):
                await messenger.react(channel, ts, name, add=False)
            case Typing(channel=channel, thread=thread):
                await messenger.typing(Where(channel, thread))
            case CaseUpdate(escalation_id=escalation_id):
                where = await self.renderer().case_thread(escalation_id)
                if where is not None:
                    await messenger.update(Where(where[0], None), where[1], await self.renderer().case(escalation_id))
            case RelayEdit(conversation_id=conversation_id, escalation_id=escalation_id, source=source):
                # No copy yet: the relay is still to go out, and it reads the words as they are now.
                copy = await self.ledger.relayed_copy(source)
                words = await self.renderer().staff_words(conversation_id, source)
                if copy is not None and words is not None:
                    place, ts, author = copy
                    relay = RelayToCustomer(conversation_id, escalation_id, place.channel, None, author, words, None)
                    shown = await self.renderer().relay_to_customer(relay)
                    await messenger.update(place, ts, shown or Message(relay_text(words)))
            case RelayDelete(source=source):
                copy = await self.ledger.relayed_copy(source)
                if copy is not None:
                    await messenger.delete(copy[0], copy[1])
            case Erase(erases=None, channel=channel, thread=thread, message=ts):
                if ts:
                    await messenger.delete(Where(channel, thread), ts)
            case Erase(erases=row_id):
                post = await self.ledger.post_of(row_id) if row_id is not None else None
                if post is None:
                    return
                made, made_ts, uploaded = post
                sharing = messenger if uploaded and isinstance(messenger, FileSharing) else None
                if made_ts is None and sharing is not None:
                    # A share's ts is often not in the platform's answer: its files say where they were shared.
                    made_ts = await _share_of(sharing, await self.where(made), uploaded)
                if made_ts is not None:  # never posted: no message to take down
                    try:
                        await messenger.delete(await self.where(made), made_ts)
                    except Refused as exc:
                        if exc.error != "message_not_found":  # gone already: its files go still
                            raise
                # The files a relay uploaded again outlive the message that shared them (and one never shared too).
                if sharing is not None:
                    for file_id in uploaded:
                        await sharing.delete_file(file_id)
            case StaffNotice(escalation_id=escalation_id, author=user, text=notice):
                where = await self.renderer().case_thread(escalation_id)
                if where is not None:
                    await messenger.notice(Where(*where), user, notice)
            case _:
                assert_never(delivery)


async def _share_of(sharing: FileSharing, where: Where, uploaded: list[str]) -> str | None:
    """The message that shared `uploaded` in `where`; None when it was not shared, or its files are gone already."""
    try:
        return await sharing.find_share(where, uploaded)
    except Refused as exc:
        if exc.error != "file_not_found":
            raise
        return None
