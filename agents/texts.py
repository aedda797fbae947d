"""What the bot says in its own words, in each of its languages: one closed set of keys (`Text`), the catalog of
every key in every `Language`, and `Texts`, the catalog with the operator's overrides, asked for a key in the
customer's language.

The keys are the names an operator overrides them by (the declaration's `texts:`, the settings of the same names),
so a text is called one thing in the file, the environment, the docs and here. Placeholders are the same in every
language (`TEMPLATES`); `{when}` is filled with words of the customer's language (`Texts.limited`). The register is
informal where the English is friendly: tú, du, tu, você. A `status_` text is a progress line, then on each line
after it a loading message (Slack's AI status shows the first after the app's name and rotates the others).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from agents.language import Language


class Text(enum.StrEnum):
    HANDOFF_NOTICE = "handoff_notice"
    ESCALATION_MESSAGE = "escalation_message"
    BUDGET_MESSAGE = "budget_message"
    PROVIDER_FAILURE_MESSAGE = "provider_failure_message"
    OFF_HOURS_MESSAGE = "off_hours_message"
    RESOLVED_MESSAGE = "resolved_message"
    PAUSED_MESSAGE = "paused_message"
    HANDED_BACK_MESSAGE = "handed_back_message"
    CASE_UNREACHABLE_MESSAGE = "case_unreachable_message"
    RATE_LIMITED_MESSAGE = "rate_limited_message"
    CSAT_QUESTION = "csat_question"
    CSAT_THANKS = "csat_thanks"
    CSAT_COMMENT_TITLE = "csat_comment_title"
    CSAT_COMMENT_LABEL = "csat_comment_label"
    CSAT_COMMENT_SEND = "csat_comment_send"
    CSAT_COMMENT_SKIP = "csat_comment_skip"
    OFFLINE_GREETING = "offline_greeting"
    HOME_NOTE = "home_note"
    SOURCES_LINE = "sources_line"
    FEEDBACK_HELPED = "feedback_helped"
    FEEDBACK_NOT_HELPED = "feedback_not_helped"
    STATUS_THINKING = "status_thinking"
    STATUS_SEARCHING = "status_searching"
    STATUS_CHECKING_ORDER = "status_checking_order"
    STATUS_PREPARING_REFUND = "status_preparing_refund"
    STATUS_LOOKING_IN_CATALOGUE = "status_looking_in_catalogue"
    STATUS_FINDING_COLLEAGUE = "status_finding_colleague"
    STATUS_WORKING = "status_working"
    STATUS_HANDOFF = "status_handoff"
    STREAM_STARTED = "stream_started"
    OFFLINE_FOUND = "offline_found"
    OFFLINE_SOURCE = "offline_source"
    OFFLINE_MORE = "offline_more"
    CSAT_NOT_YOURS = "csat_not_yours"
    CSAT_COMMENT_NOT_YOURS = "csat_comment_not_yours"
    CSAT_RATING_NOT_SAVED = "csat_rating_not_saved"
    CSAT_COMMENT_NOT_SAVED = "csat_comment_not_saved"


TEMPLATES: Mapping[str, frozenset[str]] = {
    Text.HANDOFF_NOTICE: frozenset({"agent"}),
    Text.OFF_HOURS_MESSAGE: frozenset({"hours"}),
    Text.RATE_LIMITED_MESSAGE: frozenset({"when"}),
    Text.SOURCES_LINE: frozenset({"sources"}),
    Text.STATUS_HANDOFF: frozenset({"agent"}),
    Text.OFFLINE_SOURCE: frozenset({"source"}),
}
"""The texts filled in with values, and the placeholders each may use; every other text is posted as written."""

SHORT: Mapping[str, int] = {
    Text.CSAT_COMMENT_TITLE: 24,
    Text.CSAT_COMMENT_SEND: 24,
    Text.CSAT_COMMENT_SKIP: 24,
    Text.FEEDBACK_HELPED: 75,
    Text.FEEDBACK_NOT_HELPED: 75,
}
"""Texts Slack refuses longer than this (a modal's title and buttons, a feedback button's accessibility label): an
override is checked against it."""

Window = Literal["minute", "day"]
"""When a rate limit lets the customer write again: the `{when}` of `rate_limited_message`."""

EN, ES, DE, FR, PT = Language.EN, Language.ES, Language.DE, Language.FR, Language.PT

CATALOG: Mapping[Text, Mapping[Language, str]] = {
    Text.HANDOFF_NOTICE: {
        EN: "_Connecting you with {agent}…_",
        ES: "_Te paso con {agent}…_",
        DE: "_Ich verbinde dich mit {agent}…_",
        FR: "_Je te mets en relation avec {agent}…_",
        PT: "_Vou te passar para {agent}…_",
    },
    Text.ESCALATION_MESSAGE: {
        EN: "I've asked a colleague to join. A person will reply here shortly.",
        ES: "He pedido a un compañero que se una a la conversación. Una persona te responderá aquí en breve.",
        DE: "Ich habe jemanden aus dem Team dazugeholt. Eine Person antwortet dir hier in Kürze.",
        FR: "J'ai demandé à un collègue de nous rejoindre. Une personne va te répondre ici sous peu.",
        PT: "Pedi para um colega entrar na conversa. Uma pessoa vai te responder aqui em breve.",
    },
    Text.BUDGET_MESSAGE: {
        EN: (
            "I'm sorry, I haven't managed to sort this out myself, so I've asked a colleague to take over. "
            "A person will reply here shortly."
        ),
        ES: (
            "Lo siento, no he conseguido resolverlo yo solo, así que he pedido a un compañero que se encargue. "
            "Una persona te responderá aquí en breve."
        ),
        DE: (
            "Tut mir leid, das konnte ich nicht allein lösen, deshalb habe ich jemanden aus dem Team gebeten, zu "
            "übernehmen. Eine Person antwortet dir hier in Kürze."
        ),
        FR: (
            "Désolé, je n'ai pas réussi à régler ça moi-même, alors j'ai demandé à un collègue de prendre le relais. "
            "Une personne va te répondre ici sous peu."
        ),
        PT: (
            "Desculpe, não consegui resolver isso sozinho, então pedi para um colega assumir. Uma pessoa vai te "
            "responder aqui em breve."
        ),
    },
    Text.PROVIDER_FAILURE_MESSAGE: {
        EN: (
            "I'm sorry, I'm having trouble answering right now. Your message is saved and I've passed it to a "
            "colleague, who will reply here."
        ),
        ES: (
            "Lo siento, ahora mismo tengo problemas para responder. Tu mensaje está guardado y se lo he pasado a un "
            "compañero, que te responderá aquí."
        ),
        DE: (
            "Tut mir leid, ich kann gerade nicht antworten. Deine Nachricht ist gespeichert, und ich habe sie an "
            "jemanden aus dem Team weitergegeben, der dir hier antwortet."
        ),
        FR: (
            "Désolé, j'ai du mal à répondre pour le moment. Ton message est enregistré et je l'ai transmis à un "
            "collègue, qui te répondra ici."
        ),
        PT: (
            "Desculpe, estou com dificuldade para responder agora. Sua mensagem foi salva e eu a passei para um "
            "colega, que vai te responder aqui."
        ),
    },
    Text.OFF_HOURS_MESSAGE: {
        EN: "Our team is available {hours}; a colleague will reply as soon as they are back.",
        ES: "Nuestro equipo está disponible {hours}; un compañero te responderá en cuanto vuelva.",
        DE: "Unser Team ist {hours} erreichbar; sobald es wieder da ist, antwortet dir jemand.",
        FR: "Notre équipe est disponible {hours} ; un collègue te répondra dès son retour.",
        PT: "Nossa equipe está disponível {hours}; um colega vai te responder assim que voltar.",
    },
    Text.RESOLVED_MESSAGE: {
        EN: "This conversation is now closed. If you need anything else, just write here again.",
        ES: "Esta conversación queda cerrada. Si necesitas algo más, escribe aquí de nuevo.",
        DE: "Dieses Gespräch ist jetzt abgeschlossen. Wenn du noch etwas brauchst, schreib einfach wieder hier.",
        FR: "Cette conversation est maintenant close. Si tu as besoin d'autre chose, réécris simplement ici.",
        PT: "Esta conversa foi encerrada. Se precisar de mais alguma coisa, é só escrever aqui de novo.",
    },
    Text.PAUSED_MESSAGE: {
        EN: "Our assistant is paused here for now, so I've passed your message to a colleague, who will reply here.",
        ES: (
            "Nuestro asistente está en pausa aquí por ahora, así que he pasado tu mensaje a un compañero, que te "
            "responderá aquí."
        ),
        DE: (
            "Unser Assistent ist hier gerade pausiert, deshalb habe ich deine Nachricht an jemanden aus dem Team "
            "weitergegeben, der dir hier antwortet."
        ),
        FR: (
            "Notre assistant est en pause ici pour le moment, alors j'ai transmis ton message à un collègue, qui te "
            "répondra ici."
        ),
        PT: (
            "Nosso assistente está pausado aqui por enquanto, então passei sua mensagem para um colega, que vai te "
            "responder aqui."
        ),
    },
    Text.HANDED_BACK_MESSAGE: {
        EN: "You're back with our assistant; ask away. A colleague is one message away if needed.",
        ES: (
            "Vuelves a estar con nuestro asistente; pregunta lo que quieras. Si hace falta, un compañero está a un "
            "mensaje de distancia."
        ),
        DE: (
            "Du bist wieder bei unserem Assistenten; frag ruhig. Falls nötig, ist das Team nur eine Nachricht entfernt."
        ),
        FR: (
            "Te revoilà avec notre assistant ; pose tes questions. Si besoin, un collègue n'est qu'à un message de toi."
        ),
        PT: (
            "Você está de volta com nosso assistente; pode perguntar. Se precisar, um colega está a uma mensagem de "
            "distância."
        ),
    },
    Text.CASE_UNREACHABLE_MESSAGE: {
        EN: (
            "I'm sorry: I could not reach a colleague just now. Our team has been told about your request and will "
            "follow up here."
        ),
        ES: (
            "Lo siento: no he podido contactar con un compañero ahora mismo. Nuestro equipo ya sabe de tu solicitud y "
            "te responderá aquí."
        ),
        DE: (
            "Tut mir leid: Ich konnte gerade niemanden aus dem Team erreichen. Unser Team weiß von deiner Anfrage und "
            "meldet sich hier bei dir."
        ),
        FR: (
            "Désolé : je n'ai pas pu joindre un collègue pour l'instant. Notre équipe a été informée de ta demande et "
            "te répondra ici."
        ),
        PT: (
            "Desculpe: não consegui falar com um colega agora. Nossa equipe já sabe do seu pedido e vai te responder "
            "aqui."
        ),
    },
    Text.RATE_LIMITED_MESSAGE: {
        EN: (
            "You've sent more messages than I can answer right now. Everything you wrote is kept: write again {when} "
            "and I'll pick it up from there."
        ),
        ES: (
            "Has enviado más mensajes de los que puedo responder ahora mismo. Todo lo que has escrito queda guardado: "
            "vuelve a escribir {when} y seguiré desde ahí."
        ),
        DE: (
            "Du hast mehr Nachrichten geschickt, als ich gerade beantworten kann. Alles, was du geschrieben hast, "
            "bleibt erhalten: Schreib {when} wieder, dann mache ich dort weiter."
        ),
        FR: (
            "Tu as envoyé plus de messages que je ne peux en traiter pour l'instant. Tout ce que tu as écrit est "
            "conservé : réécris {when} et je reprendrai là où on en était."
        ),
        PT: (
            "Você mandou mais mensagens do que consigo responder agora. Tudo o que você escreveu está guardado: "
            "escreva de novo {when} e eu continuo de onde parei."
        ),
    },
    Text.CSAT_QUESTION: {
        EN: "How did we do? Please rate the help you got from our team.",
        ES: "¿Qué tal lo hicimos? Valora la ayuda que recibiste de nuestro equipo.",
        DE: "Wie zufrieden warst du? Bitte bewerte die Hilfe, die du von unserem Team bekommen hast.",
        FR: "Qu'en as-tu pensé ? Note l'aide que tu as reçue de notre équipe.",
        PT: "Como nos saímos? Avalie a ajuda que você recebeu da nossa equipe.",
    },
    Text.CSAT_THANKS: {
        EN: "Thank you for your rating!",
        ES: "¡Gracias por tu valoración!",
        DE: "Danke für deine Bewertung!",
        FR: "Merci pour ta note !",
        PT: "Obrigado pela sua avaliação!",
    },
    Text.CSAT_COMMENT_TITLE: {
        EN: "Thanks for rating us",
        ES: "Gracias por valorarnos",
        DE: "Danke fürs Bewerten",
        FR: "Merci pour ta note",
        PT: "Obrigado pela avaliação",
    },
    Text.CSAT_COMMENT_LABEL: {
        EN: "Anything we could do better?",
        ES: "¿Hay algo que podamos mejorar?",
        DE: "Können wir etwas besser machen?",
        FR: "Y a-t-il quelque chose qu'on pourrait améliorer ?",
        PT: "Tem algo que podemos fazer melhor?",
    },
    Text.CSAT_COMMENT_SEND: {EN: "Send", ES: "Enviar", DE: "Senden", FR: "Envoyer", PT: "Enviar"},
    Text.CSAT_COMMENT_SKIP: {EN: "Skip", ES: "Omitir", DE: "Überspringen", FR: "Passer", PT: "Pular"},
    Text.OFFLINE_GREETING: {
        EN: (
            "Hello! I'm the assistant here. I can answer from our help articles, or bring in a colleague. What can I "
            "do for you?"
        ),
        ES: (
            "¡Hola! Soy el asistente. Puedo responderte con nuestros artículos de ayuda o avisar a un compañero. ¿En "
            "qué te puedo ayudar?"
        ),
        DE: (
            "Hallo! Ich bin hier der Assistent. Ich kann dir mit unseren Hilfeartikeln antworten oder jemanden aus "
            "dem Team dazuholen. Wie kann ich dir helfen?"
        ),
        FR: (
            "Bonjour ! Je suis l'assistant. Je peux te répondre à partir de nos articles d'aide ou faire appel à un "
            "collègue. Que puis-je faire pour toi ?"
        ),
        PT: (
            "Olá! Sou o assistente daqui. Posso responder com nossos artigos de ajuda ou chamar um colega. Como posso "
            "te ajudar?"
        ),
    },
    Text.HOME_NOTE: {
        EN: (
            "This is the helpdesk bot. Ask your question in a support channel or in a direct message here, and our "
            "assistant answers; a colleague joins when it cannot help."
        ),
        ES: (
            "Este es el bot de ayuda. Haz tu pregunta en un canal de soporte o en un mensaje directo aquí y nuestro "
            "asistente te responde; si no puede ayudarte, se une un compañero."
        ),
        DE: (
            "Das ist der Helpdesk-Bot. Stell deine Frage in einem Support-Kanal oder hier per Direktnachricht, und "
            "unser Assistent antwortet; kann er nicht helfen, kommt jemand aus dem Team dazu."
        ),
        FR: (
            "Voici le bot d'assistance. Pose ta question dans un canal de support ou ici en message direct, et notre "
            "assistant te répond ; un collègue prend le relais s'il ne peut pas t'aider."
        ),
        PT: (
            "Este é o bot de suporte. Faça sua pergunta em um canal de suporte ou em uma mensagem direta aqui, e "
            "nosso assistente responde; um colega entra na conversa quando ele não puder ajudar."
        ),
    },
    Text.SOURCES_LINE: {
        EN: "Sources: {sources}",
        ES: "Fuentes: {sources}",
        DE: "Quellen: {sources}",
        FR: "Sources : {sources}",
        PT: "Fontes: {sources}",
    },
    Text.FEEDBACK_HELPED: {
        EN: "This answer helped",
        ES: "Esta respuesta me ayudó",
        DE: "Diese Antwort hat mir geholfen",
        FR: "Cette réponse m'a aidé",
        PT: "Esta resposta me ajudou",
    },
    Text.FEEDBACK_NOT_HELPED: {
        EN: "This answer did not help",
        ES: "Esta respuesta no me ayudó",
        DE: "Diese Antwort hat mir nicht geholfen",
        FR: "Cette réponse ne m'a pas aidé",
        PT: "Esta resposta não me ajudou",
    },
    Text.STATUS_THINKING: {
        EN: "is thinking…\nReading your message…\nThinking it over…",
        ES: "está pensando…\nLeyendo tu mensaje…\nDándole vueltas…",
        DE: "denkt nach…\nLese deine Nachricht…\nDenke darüber nach…",
        FR: "réfléchit…\nLecture de ton message…\nRéflexion en cours…",
        PT: "está pensando…\nLendo sua mensagem…\nPensando no assunto…",
    },
    Text.STATUS_SEARCHING: {
        EN: "is searching…\nSearching the help articles…",
        ES: "está buscando…\nBuscando en los artículos de ayuda…",
        DE: "sucht…\nDurchsuche die Hilfeartikel…",
        FR: "cherche…\nRecherche dans les articles d'aide…",
        PT: "está procurando…\nProcurando nos artigos de ajuda…",
    },
    Text.STATUS_CHECKING_ORDER: {
        EN: "is checking your order…\nChecking your order…",
        ES: "está revisando tu pedido…\nRevisando tu pedido…",
        DE: "prüft deine Bestellung…\nPrüfe deine Bestellung…",
        FR: "vérifie ta commande…\nVérification de ta commande…",
        PT: "está verificando seu pedido…\nVerificando seu pedido…",
    },
    Text.STATUS_PREPARING_REFUND: {
        EN: "is preparing your refund…\nChecking the refund…",
        ES: "está preparando tu reembolso…\nRevisando el reembolso…",
        DE: "bereitet deine Erstattung vor…\nPrüfe die Erstattung…",
        FR: "prépare ton remboursement…\nVérification du remboursement…",
        PT: "está preparando seu reembolso…\nVerificando o reembolso…",
    },
    Text.STATUS_LOOKING_IN_CATALOGUE: {
        EN: "is looking in the catalogue…\nLooking through the catalogue…",
        ES: "está mirando el catálogo…\nRevisando el catálogo…",
        DE: "schaut im Katalog nach…\nDurchsuche den Katalog…",
        FR: "regarde dans le catalogue…\nRecherche dans le catalogue…",
        PT: "está olhando o catálogo…\nProcurando no catálogo…",
    },
    Text.STATUS_FINDING_COLLEAGUE: {
        EN: "is finding a colleague…\nFinding a colleague for you…",
        ES: "está buscando a un compañero…\nBuscando a un compañero para ti…",
        DE: "sucht jemanden aus dem Team…\nSuche jemanden aus dem Team für dich…",
        FR: "cherche un collègue…\nRecherche d'un collègue pour toi…",
        PT: "está procurando um colega…\nProcurando um colega para você…",
    },
    Text.STATUS_WORKING: {
        EN: "is working on it…\nWorking on it…",
        ES: "está en ello…\nTrabajando en ello…",
        DE: "arbeitet daran…\nArbeite daran…",
        FR: "s'en occupe…\nTraitement en cours…",
        PT: "está cuidando disso…\nCuidando disso…",
    },
    Text.STATUS_HANDOFF: {
        EN: "is asking {agent}…\nPassing you to {agent}…",
        ES: "está consultando a {agent}…\nTe paso con {agent}…",
        DE: "fragt {agent}…\nIch verbinde dich mit {agent}…",
        FR: "consulte {agent}…\nJe te mets en relation avec {agent}…",
        PT: "está chamando {agent}…\nVou te passar para {agent}…",
    },
    Text.STREAM_STARTED: {
        EN: "Writing an answer…",
        ES: "Escribiendo una respuesta…",
        DE: "Schreibe eine Antwort…",
        FR: "Rédaction d'une réponse…",
        PT: "Escrevendo uma resposta…",
    },
    Text.OFFLINE_FOUND: {
        EN: "Here is what I found in our help articles:",
        ES: "Esto es lo que he encontrado en nuestros artículos de ayuda:",
        DE: "Das habe ich in unseren Hilfeartikeln gefunden:",
        FR: "Voici ce que j'ai trouvé dans nos articles d'aide :",
        PT: "Olha o que encontrei nos nossos artigos de ajuda:",
    },
    Text.OFFLINE_SOURCE: {
        EN: "_Source: {source}_",
        ES: "_Fuente: {source}_",
        DE: "_Quelle: {source}_",
        FR: "_Source : {source}_",
        PT: "_Fonte: {source}_",
    },
    Text.OFFLINE_MORE: {
        EN: "If this doesn't answer your question, say so and I'll bring in a colleague.",
        ES: "Si esto no responde a tu pregunta, dímelo y aviso a un compañero.",
        DE: "Wenn das deine Frage nicht beantwortet, sag Bescheid, dann hole ich jemanden aus dem Team dazu.",
        FR: "Si ça ne répond pas à ta question, dis-le-moi et je fais appel à un collègue.",
        PT: "Se isso não responder à sua pergunta, é só falar que eu chamo um colega.",
    },
    Text.CSAT_NOT_YOURS: {
        EN: "Only the customer whose conversation it was can rate it.",
        ES: "Solo el cliente de esta conversación puede valorarla.",
        DE: "Nur die Person, deren Gespräch es war, kann es bewerten.",
        FR: "Seul le client de cette conversation peut la noter.",
        PT: "Só o cliente desta conversa pode avaliá-la.",
    },
    Text.CSAT_COMMENT_NOT_YOURS: {
        EN: "Only the customer who rated this case can comment on it.",
        ES: "Solo el cliente que valoró este caso puede comentarlo.",
        DE: "Nur die Person, die diesen Fall bewertet hat, kann ihn kommentieren.",
        FR: "Seul le client qui a noté ce cas peut le commenter.",
        PT: "Só o cliente que avaliou este caso pode comentá-lo.",
    },
    Text.CSAT_RATING_NOT_SAVED: {
        EN: "Your rating could not be saved just now; please try again.",
        ES: "No he podido guardar tu valoración ahora mismo; inténtalo de nuevo.",
        DE: "Deine Bewertung konnte gerade nicht gespeichert werden; bitte versuch es noch einmal.",
        FR: "Ta note n'a pas pu être enregistrée pour le moment ; réessaie, s'il te plaît.",
        PT: "Não consegui salvar sua avaliação agora; tente de novo, por favor.",
    },
    Text.CSAT_COMMENT_NOT_SAVED: {
        EN: "Your comment could not be saved just now; please try again.",
        ES: "No he podido guardar tu comentario ahora mismo; inténtalo de nuevo.",
        DE: "Dein Kommentar konnte gerade nicht gespeichert werden; bitte versuch es noch einmal.",
        FR: "Ton commentaire n'a pas pu être enregistré pour le moment ; réessaie, s'il te plaît.",
        PT: "Não consegui salvar seu comentário agora; tente de novo, por favor.",
    },
}

WHEN: Mapping[Window, Mapping[Language, str]] = {
    "minute": {
        EN: "in a minute",
        ES: "en un minuto",
        DE: "in einer Minute",
        FR: "dans une minute",
        PT: "daqui a um minuto",
    },
    "day": {EN: "tomorrow", ES: "mañana", DE: "morgen", FR: "demain", PT: "amanhã"},
}


@dataclass(frozen=True)
class Texts:
    """The catalog as this operator has it: `default` is the language of a conversation whose language is not
    known, and `overrides` the operator's own words per language (a key not overridden in a language is the
    catalog's)."""

    default: Language = Language.EN
    overrides: Mapping[Language, Mapping[str, str]] = field(default_factory=dict)

    def get(self, key: Text, language: Language | None = None) -> str:
        """`key` in `language` (None: the default). An override may be empty: that text is not said (no handoff
        notice), and empty in the operator's language, it is said in no language not given its own words."""
        spoken = language or self.default
        own = self.overrides.get(spoken, {})
        if key in own:
            return own[key]
        return "" if self.overrides.get(self.default, {}).get(key) == "" else CATALOG[key][spoken]

    def limited(self, window: Window, language: Language | None = None) -> str:
        spoken = language or self.default
        return self.get(Text.RATE_LIMITED_MESSAGE, spoken).format(when=WHEN[window][spoken])
