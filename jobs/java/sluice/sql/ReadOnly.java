package sluice.sql;

import java.util.Arrays;
import java.util.Collections;
import java.util.HashSet;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.WeakHashMap;

import org.apache.hadoop.fs.Path;

import org.apache.spark.SparkConf;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.FunctionIdentifier;
import org.apache.spark.sql.catalyst.TableIdentifier;
import org.apache.spark.sql.catalyst.analysis.ResolvedTable;
import org.apache.spark.sql.catalyst.catalog.CatalogTable;
import org.apache.spark.sql.catalyst.catalog.SessionCatalog;
import org.apache.spark.sql.catalyst.catalog.HiveTableRelation;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.SubqueryExpression;
import org.apache.spark.sql.catalyst.parser.ParameterContext;
import org.apache.spark.sql.catalyst.parser.ParseException;
import org.apache.spark.sql.catalyst.parser.ParserInterface;
import org.apache.spark.sql.catalyst.plans.logical.Command;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.plans.logical.ScriptTransformation;
import org.apache.spark.sql.execution.command.SetCommand;
import org.apache.spark.sql.execution.datasources.HadoopFsRelation;
import org.apache.spark.sql.execution.datasources.LogicalRelation;
import org.apache.spark.sql.execution.datasources.v2.DataSourceV2Relation;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;

import scala.Function1;
import scala.Option;
import scala.jdk.javaapi.CollectionConverters;
import scala.runtime.BoxedUnit;

/**
 * Confines a SQL client's session to reading the catalog's tables. Before a statement runs,
 * its analysed plan is refused when it holds:
 *
 * <ul>
 *   <li>a command not on the allow-list: INSERT, UPDATE, DELETE, MERGE, DROP, ALTER, CREATE,
 *       TRUNCATE, VACUUM, OPTIMIZE, ADD JAR, ... and their path-based forms;
 *   <li>a read of anything but a table of the catalog's databases: files by path
 *       ({@code text.`/etc/passwd`}), tables of another catalog (a JDBC catalog a client
 *       configured for its session);
 *   <li>code that runs on the server: {@code SELECT TRANSFORM ... USING 'script'},
 *       {@code reflect}/{@code java_method}/{@code try_reflect};
 *   <li>a Delta table named by path ({@code DESCRIBE HISTORY delta.`/any/path`}) outside the
 *       catalog's tables' locations.
 * </ul>
 *
 * <p>Session settings pass one allow-list ({@link #SETTINGS}): what an analyst may change for
 * their own session (time zone, ANSI mode and the like). A {@code SET} of anything else is
 * refused when it is parsed; settings a client sends with its connection (the JDBC URL's
 * {@code ?key=value}, PyHive's {@code configuration}) are applied by the Thrift server
 * without a statement, so every statement of such a session is refused when it is parsed,
 * before the analyser could load a catalog those settings name.
 *
 * <p>Allowing by name and refusing the rest means a command added by a new Spark or Delta
 * release is refused until someone decides it reads only. Writes are allowed only when the
 * server was started with {@code spark.sluice.sql.allowWrites=true}: that is read from the
 * SparkContext's configuration, which a client's {@code SET} cannot change; such an endpoint
 * is an administrator's, and none of the above applies to it. The server's own
 * session, which registers the pipelines' tables, is marked with {@link #trust}; the sessions
 * the Thrift server opens for clients are new sessions and never trusted.
 */
public final class ReadOnly implements Function1<SparkSessionExtensions, BoxedUnit> {
  public static final String ALLOW_WRITES = "spark.sluice.sql.allowWrites";
  /** The databases clients may read, comma-separated (the endpoint sets "sluice"). */
  public static final String DATABASES = "spark.sluice.sql.databases";

  /**
   * The settings a client may give its session: none names a path, a catalog, a class or a
   * setting of the server. The Thrift server sets {@code spark.sql.hive.version} and
   * {@code spark.sql.binaryOutputStyle} itself, and
   * Hive's JDBC driver sends its fetch size.
   */
  public static final Set<String> SETTINGS = Set.of(
      "spark.sql.session.timeZone", "spark.sql.ansi.enabled", "spark.sql.caseSensitive",
      "spark.sql.legacy.timeParserPolicy", "spark.sql.datetime.java8API.enabled",
      "spark.sql.thriftServer.queryTimeout", "spark.sql.binaryOutputStyle", "spark.sql.hive.version",
      "hive.server2.thrift.resultset.default.fetch.size", "hive.query.timeout.seconds");

  /** Settings the server's own components give each session: Delta, as it builds its analyser. */
  private static final Map<String, String> INTERNAL = Map.of(
      "spark.sql.parquet.fieldId.read.enabled", "true", "spark.sql.parquet.fieldId.write.enabled", "true");

  /** Commands that read or change only the client's own session. */
  private static final Set<String> ALLOWED = Set.of(
      "ExplainCommand", "SetCommand", "ResetCommand", "SetCatalogAndNamespace", "SetNamespaceCommand",
      "SetCatalogCommand", "RefreshTable", "RefreshTableCommand", "DescribeDeltaDetailCommand",
      "DescribeDeltaHistory", "DescribeDeltaHistoryCommand");

  /** Prefixes of commands that only show the catalog: SHOW TABLES, DESCRIBE TABLE, ... */
  private static final String[] ALLOWED_PREFIXES = {"Show", "Describe"};

  /** Expressions that call into the JVM: reflect, java_method, try_reflect. */
  private static final Set<String> CODE = Set.of("CallMethodViaReflection", "TryReflect");

  private static final Set<Object> TRUSTED = Collections.synchronizedSet(Collections.newSetFromMap(new WeakHashMap<>()));

  /** Lets this session (the catalog's owner, not a client's) write. */
  public static void trust(Object session) {
    TRUSTED.add(session);
  }

  @Override
  public BoxedUnit apply(SparkSessionExtensions extensions) {
    extensions.injectParser((session, delegate) -> new Guard(session, delegate));
    extensions.injectCheckRule(session -> {
      boolean allowWrites = session.sparkContext().getConf().getBoolean(ALLOW_WRITES, false);
      Set<String> databases = Set.copyOf(Arrays.asList(
          session.sparkContext().getConf().get(DATABASES, "sluice").toLowerCase(Locale.ROOT).split(",")));
      return plan -> {
        if (!allowWrites && !TRUSTED.contains(session)) {
          new Check(session.sessionState().catalog(), databases).plan(plan);
        }
        return BoxedUnit.UNIT;
      };
    });
    return BoxedUnit.UNIT;
  }

  /** One statement's check; the catalog's table locations are looked up once, if needed. */
  private static final class Check {
    private final SessionCatalog catalog;
    private final Set<String> databases;
    private Set<String> locations;

    Check(SessionCatalog catalog, Set<String> databases) {
      this.catalog = catalog;
      this.databases = databases;
    }

    void plan(LogicalPlan plan) {
      String name = plan.getClass().getSimpleName();
      if (plan instanceof ScriptTransformation) {
        refuse("SELECT TRANSFORM runs a program on the server");
      }
      set(plan);
      if (plan instanceof ResolvedTable) {
        resolved((ResolvedTable) plan);
      }
      if (name.contains("PathBased")) {  // Delta's own nodes for `delta.`/path`` it has not resolved
        refuse("only the catalog's tables can be read, not tables by path");
      }
      if (plan instanceof Command && !allowed(name)) {
        refuse("this statement (" + verb(name) + ", " + name + ") would change a table or the server. Change "
            + "tables through their pipelines; an administrator can start the endpoint with "
            + "`sluice sql serve --allow-writes`");
      }
      if (plan instanceof LogicalRelation) {
        relation((LogicalRelation) plan);
      } else if (plan instanceof HiveTableRelation) {
        database(((HiveTableRelation) plan).tableMeta());
      } else if (plan instanceof DataSourceV2Relation) {
        // Delta's analyser turns reads of its tables into LogicalRelations; what is left is
        // another catalog's table.
        refuse("only the catalog's tables can be read, not " + ((DataSourceV2Relation) plan).table().name());
      }
      for (Expression e : CollectionConverters.asJava(plan.expressions())) {
        expression(e);
      }
      for (LogicalPlan child : CollectionConverters.asJava(plan.children())) {
        plan(child);
      }
    }

    /** A catalog table of the allowed databases, or files at or under such a table's location:
     * Delta reads its catalog tables by location, and its own log with plain file reads, in
     * the client's session, so once analysed they look like reads by path. */
    private void relation(LogicalRelation relation) {
      Option<CatalogTable> table = relation.catalogTable();
      if (table.isDefined()) {
        database(table.get());
        return;
      }
      String outside = relation.relation().getClass().getSimpleName();
      if (relation.relation() instanceof HadoopFsRelation) {
        Set<String> allowed = locations();
        outside = null;
        for (Path root : CollectionConverters.asJava(((HadoopFsRelation) relation.relation()).location().rootPaths())) {
          if (!within(normal(root.toUri().toString()), allowed)) {
            outside = root.toString();
          }
        }
        if (outside == null) {
          return;
        }
      }
      refuse("only the catalog's tables can be read, not files by path (" + outside + ")");
    }

    /** A table a command names (DESCRIBE HISTORY, DESCRIBE DETAIL): one of the allowed
     * databases', or a Delta table by path that is one of their tables' locations. */
    private void resolved(ResolvedTable table) {
      String[] namespace = table.identifier().namespace();
      String db = namespace.length == 1 ? namespace[0].toLowerCase(Locale.ROOT) : "";
      if (databases.contains(db)) {
        return;
      }
      if (db.equals("delta") && within(normal(new Path(table.identifier().name()).toUri().toString()), locations())) {
        return;
      }
      refuse("only the tables of " + String.join(", ", databases) + " can be read, not " + table.name());
    }

    private Set<String> locations() {
      if (locations == null) {
        locations = new HashSet<>();
        for (String db : databases) {
          if (!catalog.databaseExists(db)) {
            continue;
          }
          for (TableIdentifier id : CollectionConverters.asJava(catalog.listTables(db))) {
            try {
              locations.add(normal(catalog.getTableMetadata(id).location().toString()));
            } catch (Exception e) {
              // a table dropped meanwhile: not readable anyway
            }
          }
        }
      }
      return locations;
    }

    private void expression(Expression e) {
      if (CODE.contains(e.getClass().getSimpleName())) {
        refuse("reflect, java_method and try_reflect run code on the server");
      }
      if (e instanceof SubqueryExpression) {
        plan((LogicalPlan) ((SubqueryExpression) e).plan());
      }
      for (Expression child : CollectionConverters.asJava(e.children())) {
        expression(child);
      }
    }

    private void database(CatalogTable table) {
      Option<String> db = table.identifier().database();
      if (db.isEmpty() || !databases.contains(db.get().toLowerCase(Locale.ROOT))) {
        refuse("only the tables of " + String.join(", ", databases) + " can be read, not " + table.identifier());
      }
    }
  }

  /** Every statement of a client's session passes here before it is analysed. */
  private static final class Guard implements ParserInterface {
    private final SparkSession session;
    private final ParserInterface delegate;

    Guard(SparkSession session, ParserInterface delegate) {
      this.session = session;
      this.delegate = delegate;
    }

    private boolean guarded() {
      return !TRUSTED.contains(session) && !session.sparkContext().getConf().getBoolean(ALLOW_WRITES, false);
    }

    /** Refuse a session whose connection brought a setting off the allow-list. */
    private void checkSession() {
      if (!guarded()) {
        return;
      }
      SparkConf server = session.sparkContext().getConf();
      Map<String, String> confs = CollectionConverters.asJava(session.sessionState().conf().getAllConfs());
      Set<String> foreign = new TreeSet<>();
      for (Map.Entry<String, String> e : confs.entrySet()) {
        // The server's own: its Spark settings, the JVM's -D options Hive reads (hive.server2.*),
        // and what Delta sets.
        String key = e.getKey(), value = e.getValue();
        boolean own = value.equals(server.getOption(key).getOrElse(() -> null))
            || value.equals(System.getProperty(key)) || value.equals(INTERNAL.get(key));
        if (!own && !SETTINGS.contains(key)) {
          foreign.add(key);
        }
      }
      if (!foreign.isEmpty()) {
        refuse("the connection sets " + String.join(", ", foreign) + ", which clients may not set (they may set "
            + String.join(", ", new TreeSet<>(SETTINGS)) + ")");
      }
    }

    private LogicalPlan checked(LogicalPlan plan) {
      if (guarded()) {
        if (plan.getClass().getSimpleName().equals("CompoundBody")) {
          // A script's statements run without being parsed again, past this guard.
          refuse("SQL scripts (BEGIN ... END) are not allowed; send one statement at a time");
        }
        set(plan);
      }
      return plan;
    }

    @Override
    public LogicalPlan parsePlan(String sql) throws ParseException {
      checkSession();
      return checked(delegate.parsePlan(sql));
    }

    @Override
    public LogicalPlan parsePlanWithParameters(String sql, ParameterContext parameters) throws ParseException {
      checkSession();
      return checked(delegate.parsePlanWithParameters(sql, parameters));
    }

    @Override
    public LogicalPlan parseQuery(String sql) throws ParseException {
      checkSession();
      return delegate.parseQuery(sql);
    }

    @Override
    public Expression parseExpression(String sql) throws ParseException {
      return delegate.parseExpression(sql);
    }

    @Override
    public TableIdentifier parseTableIdentifier(String sql) throws ParseException {
      return delegate.parseTableIdentifier(sql);
    }

    @Override
    public FunctionIdentifier parseFunctionIdentifier(String sql) throws ParseException {
      return delegate.parseFunctionIdentifier(sql);
    }

    @Override
    public scala.collection.immutable.Seq<String> parseMultipartIdentifier(String sql) throws ParseException {
      return delegate.parseMultipartIdentifier(sql);
    }

    @Override
    public StructType parseRoutineParam(String sql) throws ParseException {
      return delegate.parseRoutineParam(sql);
    }

    @Override
    public StructType parseTableSchema(String sql) throws ParseException {
      return delegate.parseTableSchema(sql);
    }

    @Override
    public DataType parseDataType(String sql) throws ParseException {
      return delegate.parseDataType(sql);
    }
  }

  /** A SET of a setting off the allow-list is refused (when parsed, and again when analysed). */
  private static void set(LogicalPlan plan) {
    if (plan instanceof SetCommand) {
      Option<scala.Tuple2<String, Option<String>>> kv = ((SetCommand) plan).kv();
      if (kv.isDefined() && kv.get()._2().isDefined() && !SETTINGS.contains(kv.get()._1())) {
        refuse("SET " + kv.get()._1() + ": clients may set only " + String.join(", ", new TreeSet<>(SETTINGS)));
      }
    }
  }

  private static boolean within(String path, Set<String> locations) {
    for (String location : locations) {
      if (path.equals(location) || path.startsWith(location + "/")) {
        return true;
      }
    }
    return false;
  }

  /** file:/a/b/, file:///a/b -> file:/a/b */
  static String normal(String uri) {
    String u = uri.replaceFirst("^file:///", "file:/");
    return u.endsWith("/") ? u.substring(0, u.length() - 1) : u;
  }

  private static void refuse(String why) {
    throw new SecurityException("sluice: this SQL endpoint is read-only: " + why + ".");
  }

  static boolean allowed(String command) {
    if (ALLOWED.contains(command)) {
      return true;
    }
    for (String prefix : ALLOWED_PREFIXES) {
      if (command.startsWith(prefix)) {
        return true;
      }
    }
    return false;
  }

  /** "DeleteCommand" -> "DELETE": the statement's verb, for the message. */
  private static String verb(String name) {
    return name.replaceAll("(Command|Statement|Table|Exec)+$", "")
        .replaceAll("([a-z])([A-Z])", "$1 $2").toUpperCase(Locale.ROOT);
  }
}
