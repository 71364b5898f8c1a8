"""The AMQP listener against the real in-process core, over memory streams, with a raw
pamqp client: methods, replies, confirms, returns, errors and their reply codes."""

from __future__ import annotations

import dataclasses

import trio
from pamqp import commands
from pamqp import frame as pframe

from tests.amqp.rawclient import open_amqp

Basic = commands.Basic


async def test_publish_consume_ack_round_trip(app) -> None:
    async with open_amqp(app) as c:
        await c.open_channel(1)
        ok = await c.declare(1, "")
        assert ok.queue.startswith("amq.gen-")
        await c.send(1, Basic.Consume(queue=ok.queue, consumer_tag="c1"))
        await c.expect(Basic.ConsumeOk, 1)
        props = Basic.Properties(content_type="text/plain", headers={"a": 1, "s": "x"}, delivery_mode=2,
                                 expiration="60000", message_id="m1", priority=3, timestamp=None)
        await c.publish(1, "", ok.queue, b"hello", properties=props)
        method, got, body = await c.message()
        assert isinstance(method, Basic.Deliver)
        assert (method.consumer_tag, method.delivery_tag, method.redelivered) == ("c1", 1, False)
        assert body == b"hello"
        assert got.content_type == "text/plain" and got.headers == {"a": 1, "s": "x"}
        assert got.expiration == "60000" and got.message_id == "m1" and got.priority == 3
        await c.send(1, Basic.Ack(delivery_tag=1))
        await c.send(1, commands.Queue.Declare(queue=ok.queue, passive=True))
        again = await c.expect(commands.Queue.DeclareOk, 1)
        assert again.message_count == 0 and again.consumer_count == 1
        assert app.runtime.core.queues[ok.queue].unacked == 0


async def test_version_mismatch_is_answered_with_our_header(app) -> None:
    async with open_amqp(app, handshake=False) as c:
        await c.send_bytes(b"AMQP\x01\x01\x08\x00")
        assert await c.recv_raw(8) == b"AMQP\x00\x00\x09\x01"
        assert await c.at_eof()


async def test_garbage_instead_of_a_header_is_answered_too(app) -> None:
    async with open_amqp(app, handshake=False) as c:
        await c.send_bytes(b"GET / HTTP/1.1\r\n\r\n")
        assert await c.recv_raw(8) == b"AMQP\x00\x00\x09\x01"


async def test_amqplain_login(app) -> None:
    async with open_amqp(app, mechanism="AMQPLAIN") as c:
        await c.open_channel(1)


async def test_wrong_guest_password_is_refused_with_403(app) -> None:
    async with open_amqp(app, handshake=False) as c:
        await c.send_bytes(b"AMQP\x00\x00\x09\x01")
        await c.expect(commands.Connection.Start)
        await c.send(0, commands.Connection.StartOk(mechanism="PLAIN", response="\x00guest\x00nope"))
        code, text = await c.closed_with(None)
        assert code == 403 and text.startswith("ACCESS_REFUSED")


async def test_guest_is_refused_beyond_loopback(app) -> None:
    async with open_amqp(app, handshake=False, remote=("10.1.2.3", 5000)) as c:
        await c.send_bytes(b"AMQP\x00\x00\x09\x01")
        await c.expect(commands.Connection.Start)
        await c.send(0, commands.Connection.StartOk(mechanism="PLAIN", response="\x00guest\x00guest"))
        code, _text = await c.closed_with(None)
        assert code == 403


async def test_other_vhost_is_refused_with_530(app) -> None:
    async with open_amqp(app, handshake=False) as c:
        await c.send_bytes(b"AMQP\x00\x00\x09\x01")
        await c.expect(commands.Connection.Start)
        await c.send(0, commands.Connection.StartOk(mechanism="PLAIN", response="\x00guest\x00guest"))
        await c.expect(commands.Connection.Tune)
        await c.send(0, commands.Connection.TuneOk(channel_max=10, frame_max=131072, heartbeat=0))
        await c.send(0, commands.Connection.Open(virtual_host="other"))
        code, text = await c.closed_with(None)
        assert code == 530 and "vhost" in text


async def test_mandatory_unroutable_returns_before_its_confirm(app) -> None:
    async with open_amqp(app) as c:
        await c.open_channel(1)
        await c.send(1, commands.Confirm.Select())
        await c.expect(commands.Confirm.SelectOk, 1)
        await c.publish(1, "amq.direct", "nowhere", b"lost", mandatory=True)
        method, _props, body = await c.message()
        assert isinstance(method, Basic.Return)
        assert (method.reply_code, method.reply_text, method.exchange, method.routing_key) == (
            312, "NO_ROUTE", "amq.direct", "nowhere")
        assert body == b"lost"
        ack = await c.expect(Basic.Ack, 1)
        assert ack.delivery_tag == 1


async def test_confirm_tags_count_from_confirm_select(app) -> None:
    async with open_amqp(app) as c:
        await c.open_channel(1)
        q = (await c.declare(1, "")).queue
        await c.publish(1, "", q, b"before")
        await c.send(1, commands.Confirm.Select())
        await c.expect(commands.Confirm.SelectOk, 1)
        for i in range(3):
            await c.publish(1, "", q, b"%d" % i)
        tags = set()
        while len(tags) < 3:
            ack = await c.expect(Basic.Ack, 1)
            tags.update(range(1, ack.delivery_tag + 1) if ack.multiple else [ack.delivery_tag])
        assert tags == {1, 2, 3}


async def test_publish_to_missing_exchange_closes_the_channel_only(app) -> None:
    async with open_amqp(app) as c:
        await c.open_channel(1)
        await c.open_channel(2)
        await c.publish(1, "missing", "k", b"x")
        code, text = await c.closed_with(1)
        assert code == 404 and text == "NOT_FOUND - no exchange 'missing' in vhost '/'"
        ok = await c.declare(2, "")
        assert ok.queue
        await c.open_channel(1)  # the number is free again after close-ok


async def test_user_id_of_another_user_is_406_also_for_guest(app) -> None:
    """Without users the connection is guest's: a user_id other than "guest" is refused
    as RabbitMQ refuses it; "guest" itself is accepted."""
    async with open_amqp(app) as c:
        await c.open_channel(1)
        ok = await c.declare(1, "")
        await c.publish(1, "", ok.queue, b"mine", properties=Basic.Properties(user_id="guest"))
        await c.publish(1, "", ok.queue, b"theirs", properties=Basic.Properties(user_id="someone"))
        code, text = await c.closed_with(1)
        assert code == 406
        assert text == "PRECONDITION_FAILED - user_id property set to 'someone' but authenticated user was 'guest'"
        assert app.runtime.core.queues[ok.queue].ready_count() == 1


async def test_declare_errors_have_rabbitmq_codes(app) -> None:
    async with open_amqp(app) as c:
        await c.open_channel(1)
        await c.send(1, commands.Queue.Declare(queue="nope", passive=True))
        assert (await c.closed_with(1))[0] == 404
        await c.open_channel(1)
        await c.declare(1, "q406", durable=False)
        await c.send(1, commands.Queue.Declare(queue="q406", durable=False, arguments={"x-max-length": 5}))
        assert (await c.closed_with(1))[0] == 406
        await c.open_channel(1)
        await c.send(1, commands.Exchange.Declare(exchange="amq.bad", exchange_type="direct"))
        assert (await c.closed_with(1))[0] == 403
        await c.open_channel(1)
        await c.send(1, commands.Exchange.Declare(exchange="x1", exchange_type="nonsense"))
        code, _ = await c.closed_with(None)
        assert code in (503, 406)


async def test_exclusive_queue_of_another_connection_is_405(app) -> None:
    async with open_amqp(app) as a, open_amqp(app) as b:
        await a.open_channel(1)
        await a.declare(1, "mine", exclusive=True)
        await b.open_channel(1)
        await b.send(1, Basic.Consume(queue="mine"))
        assert (await b.closed_with(1))[0] == 405


async def test_delete_if_unused_and_if_empty_are_406(app) -> None:
    async with open_amqp(app) as c:
        await c.open_channel(1)
        await c.declare(1, "full")
        await c.publish(1, "", "full", b"x")
        await c.send(1, commands.Queue.Delete(queue="full", if_empty=True))
        assert (await c.closed_with(1))[0] == 406
        await c.open_channel(1)
        await c.send(1, commands.Queue.Purge(queue="full"))
        assert (await c.expect(commands.Queue.PurgeOk, 1)).message_count == 1
        await c.send(1, commands.Queue.Delete(queue="full", if_empty=True))
        assert (await c.expect(commands.Queue.DeleteOk, 1)).message_count == 0


async def test_get_nack_requeue_redelivers(app) -> None:
    async with open_amqp(app) as c:
        await c.open_channel(1)
        await c.declare(1, "g")
        await c.send(1, Basic.Get(queue="g"))
        await c.expect(Basic.GetEmpty, 1)
        await c.publish(1, "", "g", b"one")
        await c.publish(1, "", "g", b"two")
        await c.send(1, Basic.Get(queue="g"))
        method, _p, body = await c.message()
        assert isinstance(method, Basic.GetOk) and body == b"one" and method.message_count == 1
        await c.send(1, Basic.Nack(delivery_tag=method.delivery_tag, requeue=True))
        await c.send(1, Basic.Get(queue="g"))
        method, _p, body = await c.message()
        assert body == b"one" and method.redelivered
        await c.send(1, Basic.Ack(delivery_tag=method.delivery_tag))
        await c.send(1, Basic.Get(queue="g", no_ack=True))
        method, _p, body = await c.message()
        assert body == b"two"
        assert app.runtime.core.queues["g"].ready_count() == 0


async def test_unknown_delivery_tag_is_406(app) -> None:
    async with open_amqp(app) as c:
        await c.open_channel(1)
        await c.send(1, Basic.Ack(delivery_tag=99))
        code, text = await c.closed_with(1)
        assert code == 406


async def test_acks_in_a_row_settle_as_one_by_one_and_an_unknown_tag_among_them_is_406(app) -> None:
    """Single acks received together are one core call (``Acks``): those before an
    unknown tag stay acked, the channel closes with 406, the ones after are not taken."""
    async with open_amqp(app) as c:
        await c.open_channel(1)
        await c.declare(1, "r")
        for i in range(4):
            await c.publish(1, "", "r", b"%d" % i)
        for i in range(4):
            await c.send(1, Basic.Get(queue="r"))
            method, _p, _body = await c.message()
            assert method.delivery_tag == i + 1
        acks = [Basic.Ack(delivery_tag=tag) for tag in (1, 2, 99, 3)]
        await c.send_bytes(b"".join(pframe.marshal(ack, 1) for ack in acks))
        code, _text = await c.closed_with(1)
        assert code == 406
        queue = app.runtime.core.queues["r"]
        assert queue.acked == 2
        # the channel's close returned the unacked ones (3 and 4) to the queue
        assert queue.ready_count() == 2


async def test_qos_prefetch_holds_the_second_delivery_until_the_ack(app) -> None:
    async with open_amqp(app) as c:
        await c.open_channel(1)
        await c.declare(1, "p")
        await c.send(1, Basic.Qos(prefetch_count=1))
        await c.expect(Basic.QosOk, 1)
        await c.publish(1, "", "p", b"1")
        await c.publish(1, "", "p", b"2")
        await c.send(1, Basic.Consume(queue="p", consumer_tag="c"))
        await c.expect(Basic.ConsumeOk, 1)
        first, _p, body = await c.message()
        assert body == b"1"
        # a barrier: anything delivered before the qos-ok would arrive first
        await c.send(1, Basic.Qos(prefetch_count=1))
        await c.expect(Basic.QosOk, 1)
        await c.send(1, Basic.Ack(delivery_tag=first.delivery_tag))
        second, _p, body = await c.message()
        assert body == b"2" and second.delivery_tag == 2


async def test_a_per_consumer_qos_lifts_the_channel_wide_one(app) -> None:
    """RabbitMQ's rule: basic.qos without global after one with it removes the
    channel-wide limit; the per-consumer one applies to consumers made after it."""
    async with open_amqp(app) as c:
        await c.open_channel(1)
        await c.declare(1, "lift")
        for body in (b"1", b"2", b"3"):
            await c.publish(1, "", "lift", body)
        await c.send(1, Basic.Qos(prefetch_count=1, global_=True))
        await c.expect(Basic.QosOk, 1)
        await c.send(1, Basic.Qos(prefetch_count=2))
        await c.expect(Basic.QosOk, 1)
        await c.send(1, Basic.Consume(queue="lift", consumer_tag="c"))
        await c.expect(Basic.ConsumeOk, 1)
        assert [(await c.message())[2] for _ in range(2)] == [b"1", b"2"]
        # a barrier: a third delivery would arrive before the qos-ok
        await c.send(1, Basic.Qos(prefetch_count=2))
        await c.expect(Basic.QosOk, 1)
        assert app.runtime.core.queues["lift"].ready_count() == 1


async def test_tx_commit_and_rollback(app) -> None:
    async with open_amqp(app) as c:
        await c.open_channel(1)
        await c.declare(1, "t")
        await c.send(1, commands.Tx.Select())
        await c.expect(commands.Tx.SelectOk, 1)
        await c.publish(1, "", "t", b"kept")
        await c.send(1, commands.Tx.Commit())
        await c.expect(commands.Tx.CommitOk, 1)
        await c.publish(1, "", "t", b"dropped")
        await c.send(1, commands.Tx.Rollback())
        await c.expect(commands.Tx.RollbackOk, 1)
        assert app.runtime.core.queues["t"].ready_count() == 1
        await c.send(1, commands.Confirm.Select())
        assert (await c.closed_with(1))[0] == 406


async def test_cancel_and_recover(app) -> None:
    async with open_amqp(app) as c:
        await c.open_channel(1)
        await c.declare(1, "r")
        await c.publish(1, "", "r", b"x")
        await c.send(1, Basic.Consume(queue="r", consumer_tag="c"))
        await c.expect(Basic.ConsumeOk, 1)
        await c.message()
        await c.send(1, Basic.Recover(requeue=True))
        await c.expect(Basic.RecoverOk, 1)
        method, _p, _b = await c.message()
        assert method.redelivered
        await c.send(1, Basic.Cancel(consumer_tag="c"))
        await c.expect(Basic.CancelOk, 1)
        await c.send(1, Basic.Cancel(consumer_tag="unknown"))
        await c.expect(Basic.CancelOk, 1)


async def test_queue_deletion_notifies_the_consumer(app) -> None:
    async with open_amqp(app) as c:
        await c.open_channel(1)
        await c.open_channel(2)
        await c.declare(1, "gone")
        await c.send(1, Basic.Consume(queue="gone", consumer_tag="c"))
        await c.expect(Basic.ConsumeOk, 1)
        await c.send(2, commands.Queue.Delete(queue="gone"))
        seen = set()
        while len(seen) < 2:
            ch, value = await c.recv()
            seen.add(type(value).__name__)
            if isinstance(value, Basic.Cancel):
                assert ch == 1 and value.consumer_tag == "c"
        assert seen == {"Cancel", "DeleteOk"}


async def test_exchange_to_exchange_binding_and_headers_routing(app) -> None:
    async with open_amqp(app) as c:
        await c.open_channel(1)
        await c.send(1, commands.Exchange.Declare(exchange="src", exchange_type="fanout"))
        await c.expect(commands.Exchange.DeclareOk, 1)
        await c.send(1, commands.Exchange.Declare(exchange="hdr", exchange_type="headers"))
        await c.expect(commands.Exchange.DeclareOk, 1)
        await c.send(1, commands.Exchange.Bind(destination="hdr", source="src"))
        await c.expect(commands.Exchange.BindOk, 1)
        await c.declare(1, "hq")
        await c.send(1, commands.Queue.Bind(queue="hq", exchange="hdr", arguments={"x-match": "all", "k": "v"}))
        await c.expect(commands.Queue.BindOk, 1)
        await c.publish(1, "src", "", b"yes", properties=Basic.Properties(headers={"k": "v"}))
        await c.publish(1, "src", "", b"no", properties=Basic.Properties(headers={"k": "w"}))
        await c.send(1, Basic.Get(queue="hq", no_ack=True))
        _m, _p, body = await c.message()
        assert body == b"yes"
        await c.send(1, Basic.Get(queue="hq", no_ack=True))
        await c.expect(Basic.GetEmpty, 1)
        await c.send(1, commands.Queue.Unbind(queue="hq", exchange="hdr", arguments={"x-match": "all", "k": "v"}))
        await c.expect(commands.Queue.UnbindOk, 1)


async def test_unbind_of_what_is_not_there_is_ok_as_in_rabbitmq(app) -> None:
    async with open_amqp(app) as c:
        await c.open_channel(1)
        await c.declare(1, "ub")
        for method in (commands.Queue.Unbind(queue="ub", exchange="amq.direct", routing_key="never"),
                       commands.Queue.Unbind(queue="missing", exchange="amq.direct", routing_key="k"),
                       commands.Queue.Unbind(queue="ub", exchange="missing", routing_key="k")):
            await c.send(1, method)
            await c.expect(commands.Queue.UnbindOk, 1)
        await c.send(1, commands.Exchange.Unbind(destination="amq.fanout", source="missing", routing_key="k"))
        await c.expect(commands.Exchange.UnbindOk, 1)
        await c.send(1, commands.Queue.Bind(queue="ub", exchange="missing", routing_key="k"))
        code, _text = await c.closed_with(1)
        assert code == 404  # a bind is still refused


async def test_channel_close_requeues_unacked(app) -> None:
    async with open_amqp(app) as c:
        await c.open_channel(1)
        await c.declare(1, "u")
        await c.publish(1, "", "u", b"x")
        await c.send(1, Basic.Get(queue="u"))
        await c.message()
        await c.send(1, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
        await c.expect(commands.Channel.CloseOk, 1)
        assert app.runtime.core.queues["u"].ready_count() == 1


async def test_connection_close_releases_every_channel(app) -> None:
    core = app.runtime.core
    before = len(core.channels)
    async with open_amqp(app) as c:
        await c.open_channel(1)
        await c.open_channel(2)
        assert len(core.channels) == before + 2
        await c.send(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
        await c.expect(commands.Connection.CloseOk)
        assert await c.at_eof()
    with trio.fail_after(2):
        while len(core.channels) != before:
            await trio.sleep(0.01)


async def test_a_no_ack_get_takes_one_message_only(app) -> None:
    async with open_amqp(app) as c:
        await c.open_channel(1)
        await c.declare(1, "n")
        for i in range(3):
            await c.publish(1, "", "n", b"%d" % i)
        for i in range(3):
            await c.send(1, Basic.Get(queue="n", no_ack=True))
            method, _p, body = await c.message()
            assert body == b"%d" % i and method.message_count == 2 - i
        await c.send(1, Basic.Get(queue="n", no_ack=True))
        await c.expect(Basic.GetEmpty, 1)


async def test_channels_past_max_channels_are_refused_with_530(app) -> None:
    app.runtime.options = dataclasses.replace(app.runtime.options, max_channels=len(app.runtime.sinks) + 1)
    async with open_amqp(app) as c:
        await c.open_channel(1)
        await c.send(2, commands.Channel.Open())
        code, text = await c.closed_with(None)
        assert code == 530 and "channel limit" in text


async def test_heartbeats_both_ways(app, autojump_clock) -> None:
    start = trio.current_time()
    async with open_amqp(app, heartbeat=4) as c:
        await c.open_channel(1)
        # the broker sends heartbeats while the client is quiet...
        with trio.fail_after(10):
            _ch, frame = await c.recv(skip_heartbeats=False)
        assert frame.name == "Heartbeat"
        # ...and drops a client silent for two intervals
        assert await c.at_eof()
        assert 7 <= trio.current_time() - start <= 12


async def test_a_body_larger_than_frame_max_travels_in_many_frames(app) -> None:
    async with open_amqp(app, frame_max=4096) as c:
        await c.open_channel(1)
        await c.declare(1, "big")
        body = bytes(range(256)) * 1200  # 300 KiB: 75+ body frames each way
        await c.publish(1, "", "big", body)
        await c.send(1, Basic.Get(queue="big", no_ack=True))
        _m, _p, got = await c.message()
        assert got == body


async def test_a_failure_sending_an_event_ends_that_channel_only(app, monkeypatch) -> None:
    import broker.amqp.session as session_module

    def broken(*args: object, **kwargs: object) -> bytes:
        raise RuntimeError("bug")

    async with open_amqp(app) as consumer, open_amqp(app) as publisher:
        await consumer.open_channel(1)
        await consumer.declare(1, "fragile")
        await consumer.send(1, Basic.Consume(queue="fragile", consumer_tag="c"))
        await consumer.expect(Basic.ConsumeOk, 1)
        monkeypatch.setattr(session_module, "encode_deliver", broken)
        await publisher.open_channel(1)
        await publisher.send(1, commands.Confirm.Select())
        await publisher.expect(commands.Confirm.SelectOk, 1)
        await publisher.publish(1, "", "fragile", b"x")  # delivered in the publisher's task
        await publisher.expect(Basic.Ack, 1)
        code, _text = await consumer.closed_with(1)
        assert code == 541
        monkeypatch.undo()
        await consumer.open_channel(1)  # the connection goes on
        await consumer.send(1, Basic.Get(queue="fragile"))
        method, _p, body = await consumer.message()
        assert body == b"x" and method.redelivered


async def test_the_client_library_and_connection_name_are_kept_as_text(app) -> None:
    # RabbitMQ's client-provided name (connection_name) and product/version, as GET
    # /channels lists them; a property of another type is no name, never an error
    cases = [
        ({"connection_name": "worker-1", "version": "2.0"}, "worker-1", "rawclient/2.0"),
        ({"connection_name": bytearray(b"bytes-name")}, None, "rawclient"),
        ({"connection_name": "n" * 300}, "n" * 255, "rawclient"),
        ({"connection_name": 7, "version": {"a": 1}}, None, "rawclient"),
        ({"connection_name": "", "product": ["x"]}, None, None),
    ]
    for props, name, agent in cases:
        async with open_amqp(app, client_properties=props) as c:
            await c.open_channel(1)
            (sink,) = [s for _id, s in app.runtime.sinks.items() if getattr(s, "kind", "") == "amqp"]
            assert (sink.connection_name, sink.user_agent) == (name, agent), props
